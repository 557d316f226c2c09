"""What the dashboard's routers take from the app serving a request.

The app (`tether.web.app`) includes the routers (`api`, `pages`, `live`, `metrics`);
the routers read the app's store and access rules through `state_of`, from here, so that no
router imports the app.
"""

from __future__ import annotations

from starlette.requests import Request

from tether.store import Store
from tether.web.security import Access


def state_of(request: Request) -> tuple[Store, Access]:
    """The store and the access rules (token, hosts) of the app serving `request`."""
    st = request.app.state
    return st.store, st.access
