"""One line for any error an AWS call can end in, including answers that are not AWS answers.

botocore raises three families: `ClientError` (the service answered with an error code),
`BotoCoreError` (no credentials, no connection, a timeout) and `ResponseParserError` (the body
could not be parsed: HTML from a proxy, a captive portal or a wrong `AWS_ENDPOINT_URL`), which
derives from plain `Exception`, not `BotoCoreError`, so a handler for the first two lets it
escape as a traceback. Its message, and the `Message` of an error whose body was not JSON or XML,
carry the raw body: an HTML page. An HTML page with status 200 can even parse as XML and then
fail inside the parser with a KeyError (no `<...Result>` element): `from_parser` recognises any
exception raised in botocore's parsers. `describe` never returns markup: it names the HTTP status
and what the body looked like instead. Every AWS-calling command catches these and prints
`describe(err)` (cli/common.py `aws_call`); `doctor` and `verify` word theirs with it too, so
every command says the same thing about the same failure.

"AWS said" is kept for what AWS said (a `ClientError` with an error code). What happened on this
machine (no credentials, an expired SSO session, no network, a proxy, a TLS failure, a timeout)
is said as that, never as AWS's words: botocore raised it before or instead of any answer.
"""

from __future__ import annotations

import re
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    ProxyConnectionError,
    ReadTimeoutError,
    SSLError,
    TokenRetrievalError,
    UnauthorizedSSOTokenError,
)
from botocore.parsers import ResponseParserError


class NotAnAwsAnswer(BotoCoreError):
    """A successful status with a web page for a body: botocore would parse it into an empty answer."""

    fmt = "{operation} got an HTML page with HTTP {status}, not an AWS answer: {what}"


AWS_ERRORS: tuple[type[Exception], ...] = (BotoCoreError, ClientError, ResponseParserError)
_GUARD_ID = "gpucluster-reject-html-pages"

_MARKUP = re.compile(r"<\s*(!doctype|html|head|body|title|\?xml|[a-z][a-z0-9]*[\s>/])", re.IGNORECASE)
_WHAT = ("a proxy, a firewall or a wrong AWS_ENDPOINT_URL answered instead of AWS; "
         "check the endpoint and retry")


def reject_pages(response_dict: dict, operation_model: object = None, **_: object) -> None:
    """`before-parse` hook: a 2xx answer whose body is an HTML page is an error, not data.

    EC2's and the other query-protocol parsers read `<html>...` with status 200 as an XML answer
    with no fields, so `capacity search` would report "no offering" and others fail on a missing
    key. The body decides, not the Content-Type header: moto's server answers Cost Explorer's JSON
    with `text/html`, and a JSON or XML body is an answer whatever its header says. Streaming
    bodies (S3 objects) are never looked at.
    """
    body, status = response_dict.get("body"), int(response_dict.get("status_code") or 0)
    if status >= 300 or not isinstance(body, bytes | bytearray):
        return
    if is_html_page(bytes(body[:512])):
        raise NotAnAwsAnswer(operation=getattr(operation_model, "name", "the call"), status=status,
                             what=_WHAT)


def is_html_page(start: bytes) -> bool:
    """The first bytes of a body are an HTML page (a doctype or an <html> element), not JSON or XML."""
    head = start.lstrip().lower()
    if head.startswith(b"<?xml"):
        head = head.split(b"?>", 1)[-1].lstrip()
    return head.startswith((b"<!doctype html", b"<html"))


def guard_default_session() -> None:
    """Make boto3's default session (what `boto3.client` uses) refuse HTML pages as answers.

    Called before any client is made (each client copies the session's hooks when created).
    """
    import boto3

    session = boto3.DEFAULT_SESSION or boto3.setup_default_session() or boto3.DEFAULT_SESSION
    session.events.register("before-parse", reject_pages, unique_id=_GUARD_ID)


def from_parser(err: BaseException) -> bool:
    """Raised while botocore parsed an answer (any exception type: a KeyError from an HTML page)."""
    if isinstance(err, ResponseParserError):
        return True
    trace = err.__traceback__
    while trace is not None:
        if trace.tb_frame.f_globals.get("__name__") == "botocore.parsers":
            return True
        trace = trace.tb_next
    return False


def looks_like_markup(text: str) -> bool:
    """An HTML or XML page rather than an AWS error message."""
    return bool(_MARKUP.search(text or ""))


NO_CREDENTIALS = "no AWS credentials found (aws configure, AWS_PROFILE or environment variables)"
_UNREACHABLE = "no network, a firewall, a proxy or a wrong AWS_ENDPOINT_URL"


def local_cause(err: BaseException) -> str | None:
    """What went wrong on this machine, said as that (None: not a local cause)."""
    message = _first_line(str(err))
    endpoint = getattr(err, "kwargs", {}).get("endpoint_url") or "its endpoint"
    if isinstance(err, NoCredentialsError):
        return NO_CREDENTIALS
    if isinstance(err, (UnauthorizedSSOTokenError, TokenRetrievalError)):
        return f"the AWS SSO session has expired or is missing: run `aws sso login` ({message})"
    if isinstance(err, (PartialCredentialsError, CredentialRetrievalError, ProfileNotFound)):
        return f"the AWS credentials could not be loaded: {message}"
    if isinstance(err, NoRegionError):
        return "no AWS region: set aws:region in the stack file, --region, or AWS_REGION"
    if isinstance(err, ProxyConnectionError):
        proxy = getattr(err, "kwargs", {}).get("proxy_url") or "the proxy"
        return f"cannot reach AWS through {proxy}: check HTTPS_PROXY and the proxy ({message})"
    if isinstance(err, SSLError):
        return (f"cannot reach AWS at {endpoint}: the TLS connection failed (a proxy that inspects TLS "
                f"needs AWS_CA_BUNDLE): {message}")
    if isinstance(err, (ConnectTimeoutError, EndpointConnectionError)):
        return f"cannot reach AWS at {endpoint}: {_UNREACHABLE}"
    if isinstance(err, ReadTimeoutError):
        return f"no answer in time, retry ({message})"
    if isinstance(err, ConnectionClosedError):
        return f"the connection to {endpoint} closed before an answer: {_UNREACHABLE}; retry"
    return None


def describe(err: BaseException) -> str:
    """One line, no markup, for an AWS error of any kind: an AWS error as botocore words it, after
    `AWS said:`; a local cause said as that (`local_cause`); an answer that is not AWS's, said so."""
    local = local_cause(err)
    if local is not None:
        return local
    if isinstance(err, ResponseParserError):
        return f"AWS's answer could not be read ({_body_kind(str(err))}): {_WHAT}"
    if isinstance(err, NotAnAwsAnswer):
        return str(err)
    if from_parser(err):
        return f"AWS's answer could not be read (not the answer the API defines): {_WHAT}"
    if isinstance(err, ClientError):
        response: dict[str, Any] = err.response if isinstance(err.response, dict) else {}
        found = response.get("Error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = str(error.get("Code") or "").strip()
        message = str(error.get("Message") or "").strip()
        operation = getattr(err, "operation_name", "") or "the call"
        if looks_like_markup(message) or looks_like_markup(code):
            return (f"{operation} got an HTML page, not an AWS error "
                    f"(HTTP {status or code or 'status unknown'}): {_WHAT}")
        if not code or code.isdigit():
            detail = f": {_first_line(message)}" if message else ""
            return (f"{operation} failed with HTTP {status or code or 'status unknown'} and no AWS "
                    f"error code{detail}")
        return f"AWS said: {_first_line(str(err))}"
    if looks_like_markup(str(err)):
        return f"AWS's answer could not be read ({_body_kind(str(err))}): {_WHAT}"
    if isinstance(err, BotoCoreError):  # raised here, by botocore, before or instead of an answer
        return _first_line(str(err)) or type(err).__name__
    return f"AWS said: {_first_line(str(err)) or type(err).__name__}"


def _first_line(text: str) -> str:
    """Whitespace and line breaks collapsed: one line, nothing cut off."""
    return " ".join(text.split())


def _body_kind(text: str) -> str:
    if re.search(r"<\s*(!doctype\s+html|html)", text, re.IGNORECASE):
        return "an HTML page"
    if looks_like_markup(text):
        return "markup that is not the expected XML"
    return "not JSON or XML"
