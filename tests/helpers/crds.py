"""The controllers' CRD schemas (tests/data/k8s, kept verbatim with their sources), as
validators that refuse what the API server would: wrong types, missing required fields,
and (as ``kubectl apply --validate=strict``) fields the schema does not know.

The CEL rules (``x-kubernetes-validations``) are not evaluated; the API server runs them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parents[1] / "data" / "k8s"
FILES = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
}


@functools.cache
def validator(kind: str, api_version: str) -> jsonschema.Draft7Validator:
    """The validator for ``kind`` at ``api_version`` (a version the CRD serves)."""
    crd = yaml.safe_load((CRDS / FILES[kind]).read_text())
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    served = {v["name"]: v for v in crd["spec"]["versions"] if v["served"]}
    assert version in served, f"{kind} {api_version}: the CRD serves {sorted(served)}"
    schema = strict(served[version]["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def errors(document: dict[str, Any]) -> list[str]:
    """What the schema refuses in ``document``, one line per error (empty: valid)."""
    found = validator(document["kind"], document["apiVersion"]).iter_errors(document)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in found]


def strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused wherever it lists the known ones."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    preserves = schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and "additionalProperties" not in schema and not preserves:
        out["additionalProperties"] = False
    return out
