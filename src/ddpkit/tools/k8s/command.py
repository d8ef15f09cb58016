"""``ddpkit k8s``: print the Kubernetes manifests that run SCRIPT with ddpkit on N pods.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> parser.parse_args(["--image", "i", "--nodes", "2", "train.py"]).nodes
    2
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ddpkit.errors import ConfigError
from ddpkit.tools.k8s.manifests import K8sOptions, manifests

HELP = "print Kubernetes manifests (a Kubeflow TrainJob, or a JobSet) that run SCRIPT"
DESCRIPTION = (
    "Print the manifests for `kubectl apply -f -`: every pod runs `ddpkit run SCRIPT`, which "
    "reads its node rank and node 0's name from the controller. They carry a memory-backed "
    "/dev/shm, a grace period for one checkpoint, a shared checkpoint volume and a failure "
    "policy on ddpkit's exit codes (docs/kubernetes.md)."
)


def add_arguments(k8s: argparse.ArgumentParser) -> None:
    """The job's shape, its pods' settings, and the script.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--image", "i", "--kind", "jobset", "t.py"]).kind
        'jobset'
    """
    k8s.add_argument(
        "--kind",
        choices=("trainjob", "jobset"),
        default="trainjob",
        help="a Kubeflow Trainer TrainJob and its TrainingRuntime (default), or a "
        "JobSet for clusters without Kubeflow",
    )
    k8s.add_argument("--name", default="ddpkit", help="the job's name (a DNS label)")
    k8s.add_argument("--namespace", default=None)
    k8s.add_argument("--image", required=True, help="a container image with ddpkit and SCRIPT")
    k8s.add_argument("--nodes", type=int, default=1, help="pods (nodes)")
    k8s.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="workers per pod (default: one per GPU, or 1)",
    )
    k8s.add_argument("--gpus-per-node", type=int, default=0, help="0 for a CPU job")
    k8s.add_argument("--cpu", default=None, help="CPU per pod, like 8")
    k8s.add_argument("--memory", default=None, help="memory per pod, like 64Gi")
    k8s.add_argument(
        "--shm",
        default=None,
        metavar="SIZE",
        help="/dev/shm's size (default: 512Mi per worker, in whole Gi)",
    )
    k8s.add_argument(
        "--grace-period",
        type=int,
        default=120,
        metavar="S",
        help="seconds from SIGTERM to SIGKILL: enough for one checkpoint "
        "(`ddpkit doctor --checkpoint-dir` compares; default 120)",
    )
    k8s.add_argument(
        "--checkpoint-pvc",
        default=None,
        metavar="CLAIM",
        help="a ReadWriteMany PersistentVolumeClaim for the checkpoints",
    )
    k8s.add_argument(
        "--checkpoint-mount",
        default="/checkpoints",
        metavar="PATH",
        help="where the claim is mounted (pass it to your script)",
    )
    k8s.add_argument("--queue", default=None, help="a Kueue LocalQueue to submit to")
    k8s.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="restarts of the whole job after a lost pod or a hang (default 3; "
        "preemptions are not counted)",
    )
    k8s.add_argument("--format", choices=("yaml", "json"), default="yaml")
    k8s.add_argument("script", help="the training script, as the image holds it")
    k8s.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")


def main(args: argparse.Namespace) -> int:
    """Print the manifests the flags ask for.

    Example::

        main(parser.parse_args(["--image", "reg/wine:1", "--nodes", "2", "train.py"]))
    """
    documents = manifests(k8s_options(args), args.script, list(args.script_args))
    print(render(documents, args.format), end="")
    return 0


def k8s_options(args: argparse.Namespace) -> K8sOptions:
    """The parsed flags as :class:`K8sOptions`.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> k8s_options(parser.parse_args(["--image", "i", "t.py"])).grace_period
        120
    """
    names = (
        "name",
        "image",
        "kind",
        "nodes",
        "nproc_per_node",
        "gpus_per_node",
        "cpu",
        "memory",
        "shm",
        "grace_period",
        "checkpoint_pvc",
        "checkpoint_mount",
        "queue",
        "max_restarts",
        "namespace",
    )
    return K8sOptions(**{name: getattr(args, name) for name in names})


def render(documents: list[dict[str, Any]], form: str) -> str:
    """The documents as one YAML stream (``---`` between them), or a JSON list.

    Example:
        >>> print(render([{"kind": "JobSet"}], "json"))
        [
          {
            "kind": "JobSet"
          }
        ]
    """
    if form == "json":
        return json.dumps(documents, indent=2) + "\n"
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            "YAML output needs PyYAML: pip install 'ddpkit[k8s]', or pass --format json "
            "(kubectl applies JSON too)"
        ) from None
    return str(yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True))
