"""Prometheus adapter: current demand and demand history, or an explicit "unavailable".

Blocking (``requests`` underneath); the reconcile loop calls it from a worker thread.
Missing data, ``NaN``/``Inf``, negative rates and unreachable servers are reported as
``None`` with a reason, never as zero: a zero would read as "no demand" and shrink the fleet.
A query the server rejects as malformed raises :class:`PromQLError`, a spec problem.

Every answer is bounded (:mod:`._transport`): at most ``max_response_bytes``, whole within
``timeout_seconds``; every error message is scrubbed of credentials and cut before it can
reach a status, an Event or a log.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from prescaler.sources._profiles import Queries, QueryName
from prescaler.sources._transport import (
    AnswerError,
    AnswerTooLarge,
    BoundedAdapter,
    BoundedSession,
    scrub,
)

# Prometheus caps a range query at 11,000 points per series.
MAX_POINTS_PER_QUERY = 10_000
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Default cap on one answer's body (``ReconcileSettings.prometheus_max_response_bytes``):
a range query of 10,000 points is about 250 KB per series, so 16 MiB holds some 60 series
of it, or an instant query over some 100,000 pods, and costs the operator at most that."""
SERVICE_ACCOUNT_TOKEN = "kubernetes.io/service-account-token"


class SourceError(Exception):
    """Base of the errors a metrics source raises."""


class PromQLError(SourceError):
    """Prometheus rejected a query as malformed (a spec error, not an outage)."""

    def __init__(self, name: str, query: str, detail: str) -> None:
        super().__init__(f"query {name} is not valid PromQL: {detail}")
        self.name = name
        self.query = query


class MetricsUnavailable(SourceError):
    """Prometheus could not be reached or answered with an error."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Demand now. Each value is ``None`` when it could not be measured.

    The rates are instant reads of the profile's ``rate(x[W])`` at ``at``: each is the mean
    over the rate window that ends at ``at`` (the operator's ``W``, 2 min), the freshest
    demand there is, so it trails a sudden change by up to ``W``. The planner uses it as a
    floor under the forecast, never as a point of the forecasting grid.
    """

    at: float
    requests_per_second: float | None = None
    prompt_tokens_per_second: float | None = None
    output_tokens_per_second: float | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_growth_per_second: float | None = None
    """How fast the queue grows (negative while it drains); any finite number."""
    context_tokens: float | None = None
    kv_cache_usage: float | None = None
    """Mean KV-cache utilization, 0-1."""
    ttft_p95_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)
    """Why values are missing, one line each."""
    demand_absent: bool = False
    """Prometheus answered the demand query with no series at all (nothing exported, or
    the series vanished), as opposed to an error or a garbage value."""
    demand_name: QueryName = "requests_per_second"
    """Which of the values is the pool's demand (:attr:`Queries.demand`)."""

    @property
    def demand(self) -> float | None:
        """The pool's demand now: requests/s, or a disaggregated role's tokens/s."""
        value: float | None = getattr(self, self.demand_name)
        return value

    @property
    def available(self) -> bool:
        """Demand is known."""
        return self.demand is not None

    @property
    def tokens_per_second(self) -> float | None:
        if self.prompt_tokens_per_second is None or self.output_tokens_per_second is None:
            return None
        return self.prompt_tokens_per_second + self.output_tokens_per_second

    def mean_tokens(self) -> tuple[float | None, float | None]:
        """Mean prompt and output tokens per request, when traffic allows measuring them."""
        rps = self.requests_per_second
        prompt, output = self.prompt_tokens_per_second, self.output_tokens_per_second
        if rps is None or rps <= 1e-9 or prompt is None or output is None:
            return None, None
        if prompt + output <= 0:
            return None, None
        return prompt / rps, output / rps


def _finite(value: Any, *, signed: bool = False) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number) or (number < 0 and not signed):
        return None
    return number


def _sample(pair: Any, *, signed: bool = False) -> tuple[float, float] | None:
    """A ``[timestamp, "value"]`` pair as two finite numbers (the value >= 0 unless
    ``signed``), else ``None``."""
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        return None
    value = _finite(pair[1], signed=signed)
    if isinstance(pair[0], bool):
        return None
    try:
        stamp = float(pair[0])
    except (TypeError, ValueError, OverflowError):
        return None
    if value is None or not math.isfinite(stamp):
        return None
    return stamp, value


def _instant_value(result: Any, *, signed: bool = False) -> float | None:
    """The sum of an instant vector (or the scalar), or ``None`` when empty or garbage
    (negative counts as garbage unless ``signed``)."""
    if not isinstance(result, list):
        return None
    if len(result) == 2 and not isinstance(result[0], dict):
        sample = _sample(result, signed=signed)  # a scalar result: [ts, "value"]
        return sample[1] if sample is not None else None
    samples = [
        _sample(s.get("value"), signed=signed) if isinstance(s, dict) else None for s in result
    ]
    if not samples or any(s is None for s in samples):
        return None
    return sum(s[1] for s in samples if s is not None)


_SIGNED: frozenset[QueryName] = frozenset({"waiting_growth_per_second"})
"""Quantities that may be negative (a queue that drains)."""

_STATUS = re.compile(r"HTTP Status Code (\d+)")
_CONNECTION = re.compile(r"^\w+\((host=[^)]*)\): ")
"""urllib3's name of the connection object before its error."""


def _classify(name: str, query: str, exc: Exception, secrets: tuple[str, ...] = ()) -> SourceError:
    """A failed query as a spec problem (Prometheus' ``bad_data``: the PromQL is wrong) or
    an outage; the message scrubbed and cut."""
    if isinstance(exc, AnswerError):
        if exc.status in (400, 422) and exc.error_type == "bad_data":
            return PromQLError(name, query, scrub(exc.detail, secrets, limit=300))
        return MetricsUnavailable(f"query {name}: {scrub(str(exc), secrets, limit=300)}")
    text = str(exc)
    match = _STATUS.search(text)
    if match and match.group(1) in ("400", "422") and "bad_data" in text:
        found = re.search(r'"error":"(.*?)"', text)
        detail = found.group(1) if found else text
        return PromQLError(name, query, scrub(detail, secrets, limit=300))
    return MetricsUnavailable(f"query {name}: {scrub(text, secrets, limit=300)}")


class _CheckedPrometheus(PrometheusConnect):  # type: ignore[misc]
    """The client, with its answers checked: a 200 whose body is not the API's JSON
    envelope around a list raises :class:`MetricsUnavailable` instead of ``KeyError`` or
    ``TypeError`` from deep inside the client."""

    def custom_query(self, *args: Any, **kwargs: Any) -> Any:
        return _checked(lambda: super(_CheckedPrometheus, self).custom_query(*args, **kwargs))

    def custom_query_range(self, *args: Any, **kwargs: Any) -> Any:
        return _checked(lambda: super(_CheckedPrometheus, self).custom_query_range(*args, **kwargs))


def _checked(call: Any) -> Any:
    try:
        result = call()
    except requests.RequestException as exc:
        if not isinstance(exc, requests.exceptions.InvalidJSONError):  # a body not JSON
            raise  # the transport's: told apart by the caller
        raise MetricsUnavailable(
            f"malformed answer from Prometheus: {scrub(repr(exc), limit=200)}"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise MetricsUnavailable(
            f"malformed answer from Prometheus: {scrub(repr(exc), limit=200)}"
        ) from None
    if not isinstance(result, list):
        raise MetricsUnavailable(
            f"malformed answer from Prometheus: result is a {type(result).__name__}, not a list"
        )
    return result


def bearer_header(token: str, origin: str) -> dict[str, str]:
    """The ``Authorization`` header of a bearer token (surrounding white space dropped).
    A token with a control character (a line break inside it) is refused here, with a
    message that does not show it: ``requests`` would refuse the header with an error
    whose text holds the whole value."""
    token = token.strip()
    if not token:
        raise ValueError(f"{origin}: the token is empty")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in token):
        raise ValueError(
            f"{origin}: the token holds a control character (a line break inside it?); "
            "its value is not shown"
        )
    if not token.isascii():
        raise ValueError(f"{origin}: the token holds characters that are not ASCII")
    return {"Authorization": f"Bearer {token}"}


def secret_credentials(
    name: str, secret: Mapping[str, str], secret_type: str | None = None
) -> tuple[dict[str, str], tuple[str, str] | None]:
    """The headers and basic auth a pool's ``authSecretRef`` Secret (decoded ``data``, and
    its ``type``) gives: key ``token`` is bearer auth, keys ``username`` and ``password``
    basic auth. A ServiceAccount token Secret is refused: its token is a Kubernetes
    identity, not a Prometheus credential, and must not be sent to a URL a pool names."""
    if secret_type == SERVICE_ACCOUNT_TOKEN:
        raise ValueError(
            f"Secret {name} is a ServiceAccount token (type {SERVICE_ACCOUNT_TOKEN}); it is "
            "never sent to Prometheus: put the Prometheus token in a Secret of type Opaque"
        )
    if "token" in secret:
        return bearer_header(secret["token"], f"Secret {name}, key token"), None
    if "username" in secret and "password" in secret:
        return {}, (secret["username"], secret["password"])
    raise ValueError(f"Secret {name} needs key token, or username and password")


def plaintext_credentials(url: str, headers: Mapping[str, str], basic: object) -> str | None:
    """A warning when credentials go to ``url`` over plain ``http://``, else ``None``."""
    if not url.strip().lower().startswith("http://"):
        return None
    if any(k.lower() == "authorization" for k in headers):
        what = "a bearer token"
    elif basic is not None:
        what = "a username and password"
    else:
        return None
    return (
        f"{what} is sent to Prometheus over plain http://, readable on the network: "
        "use an https:// URL"
    )


class PrometheusSource:
    """Reads one pool's queries from one Prometheus."""

    def __init__(
        self,
        url: str,
        queries: Queries,
        *,
        headers: Mapping[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        verify_tls: bool = True,
        timeout_seconds: float = 10.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.queries = queries
        self.timeout_seconds = float(timeout_seconds)
        """One read (:meth:`snapshot`, :meth:`running_by_pod`, each range query of
        :meth:`history`) answers within this long in total, however many queries it
        makes and however slowly the bytes come: a slow Prometheus is
        ``MetricsUnavailable`` after one timeout (the reconcile waits for the read)."""
        self.max_response_bytes = int(max_response_bytes)
        """An answer larger than this is ``MetricsUnavailable``, read no further."""
        headers = dict(headers or {})
        self._secrets = tuple(
            s
            for s in (
                *(
                    v.partition(" ")[2] or v
                    for k, v in headers.items()
                    if k.lower() == "authorization"
                ),
                *(basic_auth or ()),
            )
            if s
        )
        self.warning = plaintext_credentials(url, headers, basic_auth)
        """Why the credentials are at risk (sent over plain http), or ``None``."""
        url = url.rstrip("/")
        # A refused connection or a 502-504 is retried once; a read that timed out is
        # not (a second wait would double the time the reconcile is held up).
        retry = Retry(total=1, read=0, backoff_factor=0.1, status_forcelist=(502, 503, 504))
        session = BoundedSession(self.max_response_bytes)
        session.verify = verify_tls
        self._prom = _CheckedPrometheus(
            url=url,
            headers=headers,
            disable_ssl=not verify_tls,
            retry=retry,
            auth=basic_auth,
            timeout=timeout_seconds,
            session=session,
        )
        session.mount(url, BoundedAdapter(max_retries=retry))  # over the client's own adapter

    def _message(self, text: str, limit: int = 300) -> str:
        return scrub(text, self._secrets, limit=limit)

    def _failure(self, what: str, exc: Exception) -> MetricsUnavailable:
        """A transport failure as a message fit for a status."""
        if isinstance(exc, requests.Timeout) or "timed out" in str(exc):
            # A read timeout that is not retried arrives as a ConnectionError.
            return MetricsUnavailable(
                f"{what}: Prometheus did not answer within {self.timeout_seconds:g}s"
            )
        if isinstance(exc, AnswerTooLarge):
            return MetricsUnavailable(
                f"{what}: Prometheus answered more than {self.max_response_bytes} bytes "
                "(PRESCALER_RECONCILE_PROMETHEUS_MAX_RESPONSE_BYTES); narrow the query"
            )
        if isinstance(exc, requests.ConnectionError | requests.exceptions.RetryError):
            # Its text starts with the whole query URL; the cause is what tells.
            cause = exc.args[0] if exc.args else exc
            cause = getattr(cause, "reason", None) or cause  # urllib3's MaxRetryError
            text = self._message(_CONNECTION.sub(r"\1: ", str(cause)), 200)
            if isinstance(exc, requests.exceptions.RetryError):
                return MetricsUnavailable(f"{what}: Prometheus answered {text}")
            return MetricsUnavailable(f"{what}: no connection to Prometheus: {text}")
        return MetricsUnavailable(f"{what}: {self._message(str(exc))}")

    def close(self) -> None:
        self._prom.close()

    def _query(self, name: QueryName, query: str, at: float, deadline: float) -> Any:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MetricsUnavailable(
                f"query {name}: Prometheus did not answer within {self.timeout_seconds:g}s"
            )
        try:
            return self._prom.custom_query(
                query, params={"time": f"{at:.3f}"}, timeout=max(0.1, remaining)
            )
        except (PrometheusApiClientException, AnswerError) as exc:
            raise _classify(name, query, exc, self._secrets) from None
        except (requests.RequestException, ValueError) as exc:
            raise self._failure(f"query {name}", exc) from None

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout_seconds

    def snapshot(self, at: float) -> Snapshot:
        """Every quantity at ``at``. Raises :class:`PromQLError` for a malformed query and
        :class:`MetricsUnavailable` when the server cannot be reached."""
        values: dict[str, float | None] = {}
        problems: list[str] = []
        absent = False
        deadline = self._deadline()
        for name, query in self.queries.items():
            result = self._query(name, query, at, deadline)
            signed = name in _SIGNED
            value = _instant_value(result, signed=signed)
            if value is None:
                bound = "" if signed else " >= 0"
                problems.append(f"{name}: no data or not a finite number{bound}")
            if name == self.queries.demand:
                absent = isinstance(result, list) and not result
            values[name] = value
        return Snapshot(
            at=at,
            problems=tuple(problems),
            demand_absent=absent,
            demand_name=self.queries.demand,
            **values,
        )

    def running_by_pod(self, at: float) -> dict[str, float]:
        """Requests running now on each pod (by the ``pod`` label); pods without a finite
        value >= 0 are left out. Raises like :meth:`snapshot`."""
        result = self._query("running", self.queries.running_by_pod, at, self._deadline())
        running: dict[str, float] = {}
        for series in result if isinstance(result, list) else []:
            if not isinstance(series, dict):
                continue
            pod = (series.get("metric") or {}).get("pod")
            value = _finite((series.get("value") or [None, None])[-1])
            if isinstance(pod, str) and value is not None:
                running[pod] = running.get(pod, 0.0) + value
        return running

    def history(self, start: float, end: float, step_seconds: float) -> pd.Series:
        """Mean demand (requests/s, or a role's tokens/s: :attr:`Queries.demand`) of each
        ``step_seconds`` interval, indexed by the interval's START.

        The sample indexed ``s`` is the mean demand over ``[s, s + step)``; stamps are
        multiples of the step (the forecasting grid's bins, anchored at the unix epoch),
        from the first at or after ``start`` to the last whose data ends by ``end``, so
        each sample describes a fully observed interval. Gaps and garbage samples are
        dropped (the forecaster handles the missing steps); long ranges are split to stay
        under Prometheus' per-query point cap.

        **Alignment.** Prometheus stamps ``rate(x[W])`` at time ``t`` with the mean over the
        window that *ends* at ``t``, ``(t - W, t]``, while the forecasting grid reads a
        sample as the interval that *starts* at its stamp. Read naively (``W`` = 2 min
        stamped at ``t``, taken as ``[t, t + 60 s)``), history runs 90 s late: on a real
        Prometheus, yesterday's step from 2 to 20 req/s at ``T`` read 2.0 for
        ``[T, T + 60)``, 11.0 for ``[T + 60, T + 120)`` and 20 only after that, and the
        fleet was pre-scaled that much too late. So the query's window and its stamps are
        chosen here, and each sample is re-stamped to the start of the step it describes:

        * The rate window follows the step (``W = step``, e.g. ``rate(x[60s])`` on a 60 s
          grid), queried at the END of each step and re-stamped by ``-step``: each bin is
          exactly the mean over that step (measured: 2.0 before ``T``, 20.0 from ``T``),
          with no smoothing and no lag. This needs at least two scrapes per step.
        * If that leaves more than a tenth of the steps empty (a scrape interval too long
          for the step, e.g. 60 s scrapes and a 60 s step), the operator's wider rate
          window (``Queries.rate_window_seconds``, 2 min) is read as well and used when it
          fills clearly more steps. A window ``W`` wider than the step is *centred* on
          the step it describes (queried at ``s + (step + W) / 2``): smoothed over ``W``
          but still without lag, at the price of the newest ``(W - step) / 2`` of history.
        * A custom requests/s query without ``$window`` is used as is and read as the mean
          over the step that ends at its stamp.

        The instant reads of :meth:`snapshot` keep the operator's rate window: "demand
        now" is the mean over the last ``W`` before ``at``, a floor for the planner, not a
        point on this grid.
        """
        step = float(step_seconds)
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"step_seconds must be a finite number > 0, got {step_seconds!r}")
        queries = self.queries
        first = math.ceil(start / step - 1e-9) * step
        if queries.demand_template is None:
            return self._history_at(queries.demand_query, first, end, step, step)
        series = self._history_at(queries.demand_at(step), first, end, step, step)
        wide = queries.rate_window_seconds
        if wide > step:
            expected = _steps(first, end - step, step)
            if expected > 0 and len(series) < 0.9 * expected:
                query = queries.demand_at(wide)
                smooth = self._history_at(query, first, end, step, wide)
                if len(smooth) > 1.2 * len(series):
                    series = smooth
        return series

    def _history_at(
        self, query: str, first: float, end: float, step: float, window: float
    ) -> pd.Series:
        """Samples of ``query`` (a rate over ``window``) re-stamped to the steps they describe.

        The sample for the step ``[s, s + step)`` is read at ``s + (step + window) / 2``,
        the end of a window centred on that step (``s + step`` when the window is the step).
        """
        name = self.queries.demand
        shift = (step + window) / 2
        count = _steps(first, end - shift, step)
        sums: dict[int, float] = {}
        for lo in range(0, count, MAX_POINTS_PER_QUERY):
            hi = min(count, lo + MAX_POINTS_PER_QUERY) - 1
            try:
                result = self._prom.custom_query_range(
                    query,
                    start_time=datetime.fromtimestamp(first + lo * step + shift, UTC),
                    end_time=datetime.fromtimestamp(first + hi * step + shift, UTC),
                    step=f"{step:g}",
                )
            except (PrometheusApiClientException, AnswerError) as exc:
                raise _classify(name, query, exc, self._secrets) from None
            except (requests.RequestException, ValueError) as exc:
                raise self._failure("history", exc) from None
            for series in result if isinstance(result, list) else []:
                values = series.get("values") if isinstance(series, dict) else None
                for pair in values if isinstance(values, list) else []:
                    sample = _sample(pair)  # garbage samples are gaps, never zeros
                    if sample is None:
                        continue
                    k = round((sample[0] - shift - first) / step)
                    if 0 <= k < count:
                        sums[k] = sums.get(k, 0.0) + sample[1]
        keys = sorted(sums)
        stamps = pd.to_datetime([first + k * step for k in keys], unit="s", utc=True)
        return pd.Series(
            [sums[k] for k in keys], index=pd.DatetimeIndex(stamps), dtype="float64", name="rps"
        )


def _steps(first: float, last: float, step: float) -> int:
    """How many steps ``first + k * step`` (k >= 0) are at or before ``last``."""
    if last < first:
        return 0
    return math.floor((last - first) / step + 1e-9) + 1
