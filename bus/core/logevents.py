"""The names of the activity log's events: what ``ActivityLog.record`` takes.

An event is a :class:`LogEvent`, never a bare string, so a type checker proves that nothing
writes a name auditors cannot find here. The values are the strings stored in the ``event``
column; changing one changes what old logs mean, so add members and never rename them.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["LogEvent"]


class LogEvent(StrEnum):
    """Every event bcpbus writes to the activity log; the comments say what the row holds.

    A member is a ``str`` equal to its value, so it goes into SQLite and JSON as that text.
    """

    BUS_START = "bus_start"  # the bus listens; payload: server_id, url, log_content (full | digest)
    HTTP_START = "http_start"  # the HTTP binding listens (bus.transports.http); payload: url
    RELOAD = "reload"  # a configuration reload; status ok | failed; payload: summary; error: why
    # The bus, per message: sendMessage received (payload: the envelope, or with log_content
    # digest its type and sha256; status: the sender's taint then, as "taint:<level>" or
    # "declassifier"), delivery to one target started and finished (status = outcome),
    # sendMessage answered. Each row of a message carries its epoch, and the trace id of its
    # traceparent if it had one.
    SEND_START = "send_start"
    PROCESS_START = "process_start"
    PROCESS_FINISH = "process_finish"
    SEND_FINISH = "send_finish"
    SEND_ABORTED = "send_aborted"  # the log failed before delivery: the message was refused
    PUSH_SKIPPED = "push_skipped"  # not pushed to actor; status = min_relevance | debounce
    FETCH = "fetch"  # fetchMessages; topic = the pattern; payload: sinceEpoch, nextEpoch, count
    # The bus, per connection.
    CONNECT = "connect"  # WebSocket accepted; actor = remote address
    DISCONNECT = "disconnect"  # connection closed; status = close code
    INITIALIZE = "initialize"  # a peer authenticated as actor
    AUTH_FAILED = "auth_failed"  # initialize with an unknown clientId or a wrong token
    REPLACED = "replaced"  # a newer connection took over the clientId; the old one was closed
    REVOKED = "revoked"  # a reload took actor's credentials or rights; status = why; closed
    # No initialize within the configured time. Written one by one by older versions; these
    # refusals are counted into ws_refused rows now, but old logs hold the name.
    INITIALIZE_TIMEOUT = "initialize_timeout"
    FRAME_TOO_LARGE = "frame_too_large"  # a frame above the configured maximum size
    FRAME_REFUSED = "frame_refused"  # a frame the bus does not take (status binary); 1003
    SLOW_CONSUMER = "slow_consumer"  # the bus could not write to actor in time; closed 4004
    # The bus, per request.
    REFUSED = "refused"  # authorization/policy refusal; status = reason
    TAINT_REFUSED = "taint_refused"  # delivery from a tainted peer to an untainted one refused
    LIMIT_EXCEEDED = "limit_exceeded"  # a configured limit was hit; status = which limit
    RPC_ERROR = "rpc_error"  # a request answered with a JSON-RPC error
    SUBSCRIBE = "subscribe"  # topic = the pattern; payload: debounceMs, minRelevance if set
    UNSUBSCRIBE = "unsubscribe"  # topic = the pattern
    SHUTDOWN = "shutdown"  # the bus is closing
    # Webhook peers (bus.transports.webhooks): a POST that will be retried (status = why:
    # timeout, connect_error, http_<status>; payload: attempt, final), and a delivery that
    # failed after its last attempt (status = reason; payload: attempts, sender).
    WEBHOOK_RETRY = "webhook_retry"
    DELIVERY_FAILED = "delivery_failed"
    HTTP_REFUSED = "http_refused"  # the HTTP binding's anonymous refusals per interval
    WS_REFUSED = "ws_refused"  # the WebSocket port's, the same way (bus.ops.refusals)
    # The log itself.
    CHAIN_START = "chain_start"  # a chain segment starts; status new | migrated | ...
    # A row SQLite refused; payload: event, columns, sha256 (see bus.log.rows.COLUMNS).
    ROW_UNWRITABLE = "row_unwritable"
    # The gateway (actor "system:gateway"). The payload carries query_id or subscription_id
    # and channel ("bcp:<controller>:<reader>").
    BCP_QUERY_ACCEPTED = "bcp_query_accepted"
    BCP_QUERY_REFUSED = "bcp_query_refused"  # status = reason code
    BCP_BITS_CHARGED = "bcp_bits_charged"  # payload: bits, budget_bits, budget_left
    BCP_VALIDATION = "bcp_validation"  # status = pass | fail; payload: reasons
    BCP_DELIVERED = "bcp_delivered"  # the normalized answer reached the controller
    BCP_QUERY_FAILED = "bcp_query_failed"  # status = reason (budget_exhausted, timeout, ...)
    BCP_APPROVAL_REQUESTED = "bcp_approval_requested"
    BCP_APPROVAL_DECIDED = "bcp_approval_decided"  # status = approve | reject | edit
    BCP_EXPIRED = "bcp_expired"  # a pending query timed out
    BCP_PUSH_RECEIVED = "bcp_push_received"  # a subscription push from a reader
    BCP_PUSH_REFUSED = "bcp_push_refused"  # status = reason code
    BCP_HELD = "bcp_held"  # a valid push waits for its offline controller
    BCP_SCREEN_REQUESTED = "bcp_screen_requested"  # a valid answer went to its screeners
    # One screener's outcome, status pass | flag | reject | unavailable | timeout | malformed;
    # payload: screener, findings, its detail (logged here, never passed on).
    BCP_SCREENED = "bcp_screened"
    BCP_BUDGET_RESET = "bcp_budget_reset"  # `bcpbus budget reset`: a new budget session
    # The console (peers.console, docs/console.md): actor the clientId signed in with.
    CONSOLE_SIGN_IN = "console_sign_in"  # status approver | auditor | refused; payload: address
    CONSOLE_SIGN_OUT = "console_sign_out"  # status signed_out | token_revoked | role_revoked
