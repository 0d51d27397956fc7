"""What an operator can do from the dashboard: retry a failed or cancelled run, cancel a live
one, signal a waiting one, resolve a paid call whose outcome is unknown: its answer,
or pay again. POST only, each with the CSRF token of the browser's own
session; ``--read-only`` leaves these routes out entirely (and the pages leave out their
forms)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from workerproc.store import Operator, StoreError
from workerproc.store.codec import MAX_PAYLOAD

from ..errors import SupervisorError
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
        ]

    async def retry(self, request: Request) -> Response:
        return await self._act(request, "retry", "retried")

    async def cancel(self, request: Request) -> Response:
        return await self._act(request, "cancel", "cancelled")

    async def signal(self, request: Request) -> Response:
        return await self._act(request, "signal", "signalled")

    async def resolve(self, request: Request) -> Response:
        return await self._act(request, "resolve", "resolved")

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
            await run_in_threadpool(self._apply, action, run_id, form)
        except (SupervisorError, StoreError) as exc:
            raise HTTPException(409, str(exc)) from None
        return RedirectResponse(f"/runs/{run_id}?done={done}", status_code=303)

    def _apply(self, action: str, run_id: int, form: dict[str, str]) -> None:
        if self.store.get_run(run_id) is None:
            raise not_found(f"no run {run_id}")
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
