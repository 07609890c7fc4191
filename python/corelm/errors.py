"""The HTTP client's exceptions (corelm.local has its own CorelmError for the C ABI)."""

__all__ = ["CorelmError", "CorelmConnectionError", "CorelmNotImplemented"]


class CorelmError(RuntimeError):
    """A request the server refused or could not finish.

    `status` is the HTTP status (None when no answer came back), `code` and `message` come from
    the server's OpenAI-shaped error body ``{"error": {"message", "type", "param", "code"}}``;
    `type` and `param` are kept too. For a failed prompt of generate() / classify(), `index` is
    the prompt's position in the list given.
    """

    def __init__(self, status, code, message, type=None, param=None, index=None):
        self.status = status
        self.code = code
        self.message = message
        self.type = type
        self.param = param
        self.index = index
        self.retry_after = None  # seconds to wait, for a 429 / 503 answer
        self.body = None         # the parsed error body, when it was JSON
        head = "HTTP %s" % status if status is not None else "corelm"
        if code:
            head += " " + str(code)
        super().__init__("%s: %s" % (head, message))


class CorelmConnectionError(CorelmError):
    """No HTTP answer at all: connection refused, unknown host, timeout."""

    def __init__(self, base_url, reason):
        super().__init__(None, "connection_error",
                         "cannot reach the corelm server at %s: %s (is `corelm serve` running there?)"
                         % (base_url, reason))
        self.base_url = base_url
        self.refused = False  # the connection was refused: the request never reached a server


class CorelmNotImplemented(CorelmError, NotImplementedError):
    """The server has no endpoint for this yet; `endpoint` names the one that is missing."""

    def __init__(self, endpoint, what):
        super().__init__(None, "not_implemented",
                         "%s needs the server endpoint %s, which corelm serve does not have yet"
                         % (what, endpoint))
        self.endpoint = endpoint
