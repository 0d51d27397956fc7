"""What an operator can do from the dashboard: retry a failed or cancelled run, cancel a live
one, signal a waiting one, resolve a paid call whose outcome is unknown: its answer,
or pay again; fork a run from one of its steps (a new run, whose page the answer opens).
POST only, each with the CSRF token of the browser's own session; ``--read-only`` leaves these
routes out entirely (and the pages leave out their forms)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from workerproc.store import Operator, StoreError
from workerproc.store.codec import MAX_PAYLOAD
from workerproc.store.protocol.forks import MAX_STEP
from workerproc.store.types import JSON

from ..errors import ConfigError, SupervisorError
from ..operations import actions
from .security import Secrets, same_origin, session_of
from .views import MAX_ID, not_found

FORM_TYPE = "application/x-www-form-urlencoded"


class Actions:
    def __init__(self, store: Operator, keys: Secrets) -> None:
        self.store = store
        self.keys = keys

    def routes(self) -> list[Route]:
        return [
            Route("/runs/{run_id:int}/retry", self.retry, methods=["POST"]),
            Route("/runs/{run_id:int}/cancel", self.cancel, methods=["POST"]),
            Route("/runs/{run_id:int}/signal", self.signal, methods=["POST"]),
            Route("/runs/{run_id:int}/resolve", self.resolve, methods=["POST"]),
            Route("/runs/{run_id:int}/fork", self.fork, methods=["POST"]),
        ]

    async def retry(self, request: Request) -> Response:
        return await self._act(request, "retry", "retried")

    async def cancel(self, request: Request) -> Response:
        return await self._act(request, "cancel", "cancelled")

    async def signal(self, request: Request) -> Response:
        return await self._act(request, "signal", "signalled")

    async def resolve(self, request: Request) -> Response:
        return await self._act(request, "resolve", "resolved")

    async def fork(self, request: Request) -> Response:
        return await self._act(request, "fork", "forked")

    async def _act(self, request: Request, action: str, done: str) -> Response:
        run_id = int(request.path_params["run_id"])
        if run_id > MAX_ID:
            raise not_found(f"no run {run_id}")
        if request.headers.get("content-type", "").split(";")[0].strip() != FORM_TYPE:
            raise HTTPException(415, f"send the form as {FORM_TYPE}")
        try:
            raw = await request.body()
        except ClientDisconnect:  # gone, or closed by the guard (too slow, or to make room):
            return Response(status_code=400)  # nobody to answer, nothing to log
        body = raw.decode("utf-8", "replace")
        form = dict(parse_qsl(body, max_num_fields=8))
        if not same_origin(request) or not self.keys.csrf_ok(
            session_of(request), form.get("csrf", "")
        ):
            raise HTTPException(403, "this form is stale or came from another site: reload the "
                                "page and try again")  # fmt: skip
        try:
            made = await run_in_threadpool(self._apply, action, run_id, form)
        except (SupervisorError, StoreError) as exc:
            raise HTTPException(409, str(exc)) from None
        return RedirectResponse(f"/runs/{made or run_id}?done={done}", status_code=303)

    def _apply(self, action: str, run_id: int, form: dict[str, str]) -> int | None:
        """Do ``action`` to run ``run_id``; the id of a run it started (a fork), else None."""
        if self.store.get_run(run_id) is None:
            raise not_found(f"no run {run_id}")
        if action == "fork":  # from the form's step, with its state (JSON) if one is given
            return self.store.fork(run_id, _step(form.get("step", "")), _state(form))
        if action == "signal":  # the wait's signal, with the form's JSON payload
            payload = actions.parse_json(form.get("payload") or "null", "payload",
                                               MAX_PAYLOAD)  # fmt: skip
            self.store.signal(run_id, form.get("name", ""), payload)
        elif action == "resolve":  # the form's answer (JSON), or its "pay again" button
            pay_again = form.get("how") == "pay_again"
            answer = None if pay_again else form.get("answer", "")
            actions.resolve_call(self.store, run_id, form.get("name", ""), answer,
                                       pay_again, "the answer")  # fmt: skip
        elif action == "retry":
            actions.retry(self.store, run_id)
        else:
            actions.cancel(self.store, run_id)
        return None


def _step(text: str) -> int:
    """The fork form's step: a whole number from 1 to ``MAX_STEP``."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_STEP:
        raise ConfigError(f"a fork's step must be a whole number from 1 to {MAX_STEP:,}")
    return int(text)


def _state(form: dict[str, str]) -> JSON:
    """The fork form's state (JSON), None when left empty: the step's own."""
    text = form.get("state", "").strip()
    if not text:
        return None
    state = actions.parse_json(text, "the state")
    if state is None:
        raise ConfigError("the state null: leave it empty to keep the state the step was "
                          "entered with")  # fmt: skip
    return state
