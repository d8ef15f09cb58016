"""The warm server's last preload: what its imports made is frozen, for its forks to share.

:data:`ddpkit.launch.warm.forkserver.PRELOADED` lists this module last, so importing it is the
moment the server's imports are done (Python's forkserver offers no other). Outside a
server whose collector ddpkit paused, importing it does nothing.

Example::

    multiprocessing.set_forkserver_preload([..., "ddpkit.launch.warm.serverready"])
"""

from __future__ import annotations

from ddpkit.launch.warm.forkserver import freeze_preloads

freeze_preloads()
