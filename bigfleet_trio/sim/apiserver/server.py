""":class:`ApiServer`: the embedded apiserver's state (:mod:`.state`) joined with its ASGI
application (:mod:`.app`). The one class callers construct; serve it with :mod:`.serving`.
"""

from __future__ import annotations

from typing import Any

from .app import AsgiApp, make_app
from .state import ApiState


class ApiServer(ApiState):
    """One embedded Kubernetes API server: :class:`~.state.ApiState` plus ``app``.

    Takes :class:`~.state.ApiState`'s arguments.

    Attributes:
        app: the ASGI application serving this state over HTTP.
        tls_ca_pem: CA certificate (PEM) of the HTTPS listener, when one is served.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app: AsgiApp = make_app(self)
        self.tls_ca_pem: bytes | None = None  # set by serving when it serves HTTPS
