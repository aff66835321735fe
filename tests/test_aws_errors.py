"""No traceback from an unexpected answer (issue 25, item 7).

Every AWS-calling command, answered by something that is not AWS (an HTML page from a proxy with
200 -> botocore's ResponseParserError; with 403/502 -> a ClientError whose message is the page), or
by an error without a code, prints one line (JSON with --json), exits 2 and never prints markup.
The answers are injected with a botocore `before-send` hook on the default session, so every
client any command makes (boto3.client) gets them and nothing leaves the machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from botocore.parsers import ResponseParserError
from typer.testing import CliRunner

from gpucluster import project
from gpucluster.cli import app
from gpucluster.ops.awserrors import describe

runner = CliRunner()

HTML = (b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1>"
        b"<p>The proxy server received an invalid response.</p></body></html>")


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: object) -> Iterator[bytes]:
        yield self.body


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    project.use_stacks_dir(None)
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1",
                        "AWS_RETRY_MODE": "standard", "XDG_CACHE_HOME": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def answer_with(monkeypatch: pytest.MonkeyPatch, status: int, body: bytes,
                content_type: str = "text/html") -> list[str]:
    """Every AWS call in this test gets this answer; returns the operations that were called."""
    called: list[str] = []

    def send(request: object, **kwargs: object) -> AWSResponse:
        called.append(str(kwargs.get("event_name", "")))
        return AWSResponse("https://aws.example", status, {"Content-Type": content_type}, _Raw(body))

    session = boto3.Session(region_name="us-east-1")
    session.events.register("before-send", send)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", session)
    return called


COMMANDS = [
    ["status", "dev"], ["resume", "dev", "--yes"], ["nodes", "dev"], ["hostfile", "dev", "-g", "dev-a10"],
    ["run", "dev", "-g", "dev-a10", "--", "echo", "hi"], ["scale", "dev", "-g", "dev-a10", "--desired", "1",
                                                            "--yes"],
    ["stop", "dev", "--yes"], ["start", "dev", "--yes"], ["jobs", "dev"], ["logs", "dev", "job-1"],
    ["cancel", "dev", "job-1", "--yes"], ["spend", "dev"],
    ["capacity", "search", "--type", "p5.48xlarge", "--count", "1", "--days", "1", "--region", "us-east-1"],
]
ANSWERS = {"html-200": (200, HTML), "html-403": (403, HTML), "html-502": (502, HTML),
           "empty-500": (500, b""), "garbage-400": (400, b"not json, not xml {")}


@pytest.mark.parametrize("answer", list(ANSWERS))
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_an_answer_that_is_not_aws_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch, command: list[str],
                                                      answer: str) -> None:
    called = answer_with(monkeypatch, *ANSWERS[answer])
    result = runner.invoke(app, command)
    assert called, "the command made no AWS call: the test proves nothing"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"{command[0] if command[0] != 'capacity' else 'capacity search'}: ")
    for marker in ("<", "html", "Traceback", "Bad Gateway</"):
        assert marker not in lines[0], lines[0]

    split = command.index("--") if "--" in command else len(command)
    as_json = runner.invoke(app, [*command[:split], "--json", *command[split:]])
    assert as_json.exit_code == 2, as_json.output
    document = json.loads(as_json.stdout)
    assert "<" not in json.dumps(document), document


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_doctor_reports_each_check_it_could_not_make_without_markup(monkeypatch: pytest.MonkeyPatch,
                                                                    answer: str) -> None:
    """doctor is a report: an error page for one check is that check's warning (its HTTP status,
    not the page), the other checks still run; an answer that cannot be read at all (an HTML page
    with 200) stops it in one line, exit 2."""
    answer_with(monkeypatch, *ANSWERS[answer])
    result = runner.invoke(app, ["doctor", "dev"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    for marker in ("<", "html", "Traceback"):
        assert marker not in result.output
    if ANSWERS[answer][0] == 200 or result.exit_code == 2:  # 200 always; unreadable bodies may
        assert result.exit_code == 2
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("doctor: "), lines
        if ANSWERS[answer][0] == 200:
            assert "got an HTML page with HTTP 200, not an AWS answer" in lines[0]
        return
    document = json.loads(runner.invoke(app, ["doctor", "dev", "--json"]).stdout)
    status = ANSWERS[answer][0]
    assert {f["check"] for f in document["findings"]} >= {"offering", "quota", "cost tag", "boundary"}
    asked = [f for f in document["findings"] if f["check"] != "ami"]  # the default DLAMI: known offline
    assert {f["message"] for f in asked} == {
        f"could not check (HTTP {status} with no AWS error code: not an AWS answer)"}
    assert [f["message"] for f in document["findings"] if f["check"] == "ami"] == [
        "the default Deep Learning AMI (Ubuntu 22.04): supported; jobs run as ubuntu"]
    assert result.exit_code == 0 and max(len(line) for line in result.output.splitlines()) <= 100


def test_describe_names_what_came_back() -> None:
    parse = ResponseParserError("Unable to parse response (syntax error), invalid XML received. "
                                "Further retries may succeed:\n"
                                "b'<html><body>Service Unavailable</body></html>'")
    assert describe(parse) == ("AWS's answer could not be read (an HTML page): a proxy, a firewall or a "
                               "wrong AWS_ENDPOINT_URL answered instead of AWS; check the endpoint and retry")
    page = ClientError({"Error": {"Code": "403", "Message": "<html><body>Forbidden</body></html>"},
                        "ResponseMetadata": {"HTTPStatusCode": 403}}, "DescribeInstances")
    assert describe(page).startswith("DescribeInstances got an HTML page, not an AWS error (HTTP 403): ")
    codeless = ClientError({"Error": {"Message": "Service Unavailable"},
                            "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetCostAndUsage")
    assert describe(codeless) == ("GetCostAndUsage failed with HTTP 503 and no AWS error code: "
                                  "Service Unavailable")
    real = ClientError({"Error": {"Code": "AccessDenied", "Message": "not\nallowed"}}, "DescribeInstances")
    assert describe(real) == ("AWS said: An error occurred (AccessDenied) when calling the DescribeInstances "
                              "operation: not allowed")


def test_local_causes_are_not_what_aws_said() -> None:
    """Issue 37: no credentials, no network, a proxy, TLS, a timeout happened here; AWS said nothing."""
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ParamValidationError,
        ProxyConnectionError,
        ReadTimeoutError,
        SSLError,
    )

    url = "https://ce.us-east-1.amazonaws.com"
    assert describe(NoCredentialsError()) == ("no AWS credentials found (aws configure, AWS_PROFILE or "
                                              "environment variables)")
    assert describe(EndpointConnectionError(endpoint_url=url)) == (
        f"cannot reach AWS at {url}: no network, a firewall, a proxy or a wrong AWS_ENDPOINT_URL")
    assert describe(ConnectTimeoutError(endpoint_url=url)).startswith(f"cannot reach AWS at {url}: ")
    proxy = describe(ProxyConnectionError(proxy_url="http://proxy.example:3128", error="refused"))
    assert proxy.startswith("cannot reach AWS through http://proxy.example:3128: check HTTPS_PROXY")
    assert "AWS_CA_BUNDLE" in describe(SSLError(endpoint_url=url, error="certificate verify failed"))
    assert describe(ReadTimeoutError(endpoint_url=url)).startswith("no answer in time, retry (Read timeout")
    assert describe(ParamValidationError(report="bad")).startswith("Parameter validation failed")
    for err in (NoCredentialsError(), EndpointConnectionError(endpoint_url=url),
                ParamValidationError(report="x")):
        assert "AWS said" not in describe(err)


@pytest.mark.parametrize(("body", "page"), [
    (b'{"ResultsByTime": []}', False), (b"<?xml version='1.0'?><DescribeResponse/>", False),
    (b"  <!DOCTYPE html><html></html>", True), (b"<HTML><body>proxy</body></HTML>", True),
    (b"<?xml version='1.0'?>\n<html><body>x</body></html>", True),
])
def test_the_html_guard_decides_on_the_body_not_the_header(body: bytes, page: bool) -> None:
    """moto's server answers Cost Explorer's JSON as text/html: that is an answer; an HTML body is not,
    whatever its header says."""
    from gpucluster.ops.awserrors import NotAnAwsAnswer, reject_pages

    answer = {"status_code": 200, "body": body, "headers": {"Content-Type": "text/html; charset=utf-8"}}
    if page:
        with pytest.raises(NotAnAwsAnswer):
            reject_pages(answer)
        with pytest.raises(NotAnAwsAnswer):
            reject_pages({**answer, "headers": {"Content-Type": "application/json"}})
    else:
        assert reject_pages(answer) is None


def test_a_json_answer_labelled_html_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through the CLI's session guard: `capacity search` reads EC2's XML sent as text/html."""
    xml = (b'<?xml version="1.0" encoding="UTF-8"?><DescribeCapacityBlockOfferingsResponse '
           b'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId>'
           b"<capacityBlockOfferingSet/></DescribeCapacityBlockOfferingsResponse>")
    answer_with(monkeypatch, 200, xml, content_type="text/html")
    result = runner.invoke(app, ["capacity", "search", "--type", "p5.48xlarge", "--count", "1", "--days", "1",
                                 "--region", "us-east-1"])
    assert result.exit_code in (0, 1), result.output
    assert "HTML" not in result.output and "could not be read" not in result.output
