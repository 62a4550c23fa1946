"""The console's sign-in and guards on the real Postgres: OpenID Connect against a local
provider (oidc-provider-mock), a trusted proxy's header, roles, and CSRF on every form."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from pydantic import SecretStr
from starlette.routing import Route
from starlette.testclient import TestClient

from mailroom.console.app import build_app
from tests.fixtures.console import console_settings_for, csrf_of, sign_in

pytestmark = pytest.mark.integration

OPERATOR = {"email": "olga@bank.example", "groups": ["mailroom-operators"]}
OUTSIDER = {"email": "otto@bank.example", "groups": ["payroll"]}


@pytest.fixture
def provider() -> Iterator[str]:
    """A local OIDC provider with two users; its issuer URL."""
    from oidc_provider_mock import User, run_server_in_thread

    users = [User(sub="olga", claims=OPERATOR), User(sub="otto", claims=OUTSIDER)]
    with run_server_in_thread(user_claims=users) as server:
        yield f"http://localhost:{server.server_port}"


@pytest.fixture
def oidc_console(database_url, tmp_path, provider, nudges) -> Iterator[TestClient]:
    settings = console_settings_for(
        database_url,
        tmp_path,
        auth="oidc",
        dev_sign_in=False,
        oidc_issuer=provider,
        oidc_client_id="mailroom-console",
        oidc_client_secret=SecretStr("client-secret"),
    )
    with TestClient(build_app(settings, nudges=nudges), base_url="http://127.0.0.1") as client:
        yield client


def sign_in_at_provider(client: TestClient, sub: str) -> httpx.Response:
    """Follow the console to the provider, sign in there as ``sub``, and come back."""
    assert client.get("/review", follow_redirects=False).headers["location"] == "/signin"
    to_provider = httpx.URL(client.get("/signin", follow_redirects=False).headers["location"])
    assert to_provider.host == "localhost"
    approved = httpx.post(str(to_provider), data={"sub": sub}, follow_redirects=False)
    assert approved.status_code == 302, approved.text
    back = httpx.URL(approved.headers["location"])
    assert back.path == "/auth/callback"
    return client.get(f"{back.path}?{back.query.decode()}")


async def test_an_operator_signs_in_through_openid_connect_and_is_audited(
    oidc_console, recognition_factory
):
    page = sign_in_at_provider(oidc_console, "olga")

    assert page.status_code == 200 and page.url.path == "/review"
    assert "olga@bank.example (operator)" in page.text
    [event] = await recognition_factory.rows(
        "SELECT actor_id, action, detail FROM audit_event WHERE action = 'console.signed_in'"
    )
    assert (event["actor_id"], event["detail"]) == ("olga@bank.example", {"role": "operator"})


async def test_a_user_in_no_console_group_is_refused(oidc_console):
    page = sign_in_at_provider(oidc_console, "otto")

    assert page.status_code == 403
    assert "otto@bank.example is in no group of this console" in page.text
    assert oidc_console.get("/review", follow_redirects=False).status_code == 303


@pytest.fixture
def recognition_settings(console_settings):
    return console_settings


def proxied(database_url, tmp_path, nudges, address: str) -> TestClient:
    settings = console_settings_for(
        database_url, tmp_path, auth="proxy", dev_sign_in=False, trusted_proxies=["10.1.0.0/16"]
    )
    return TestClient(
        build_app(settings, nudges=nudges), base_url="http://127.0.0.1", client=(address, 4000)
    )


async def test_a_trusted_proxy_names_the_user_and_their_role(database_url, tmp_path, nudges):
    with proxied(database_url, tmp_path, nudges, "10.1.2.3") as client:
        viewer = {"X-Forwarded-User": "vic", "X-Forwarded-Groups": "staff, mailroom-viewers"}
        page = client.get("/review", headers=viewer)
        assert page.status_code == 200 and "vic (viewer)" in page.text
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        refused = client.post("/files/1/accept", data={"csrf": token}, headers=viewer)
        assert refused.status_code == 403 and "vic is a viewer" in refused.text
        operator = {"X-Forwarded-User": "ola", "X-Forwarded-Groups": "mailroom-operators"}
        assert "ola (operator)" in client.get("/review", headers=operator).text


async def test_the_proxy_header_is_refused_from_any_other_address(database_url, tmp_path, nudges):
    with proxied(database_url, tmp_path, nudges, "192.0.2.7") as client:
        page = client.get("/review", headers={"X-Forwarded-User": "mallory"})
        assert page.status_code == 403
        assert "reached only through its proxy" in page.text


async def test_every_form_of_the_console_refuses_a_post_without_its_csrf_token(console):
    token = sign_in(console)
    posts = [
        route.path
        for route in console.app.routes
        if isinstance(route, Route) and "POST" in (route.methods or ())
    ]
    assert len(posts) >= 5
    for path in posts:
        concrete = re.sub(r"\{[^}]+\}", "1", path)
        refused = console.post(concrete, data={"csrf": "forged", "confirm": "yes"})
        assert refused.status_code == 403, (path, refused.status_code)
    assert console.get("/review").status_code == 200
    assert token


async def test_sign_in_returns_to_the_page_that_asked_for_it(console):
    assert console.get("/search?q=nobody", follow_redirects=False).status_code == 303
    page = console.get("/signin")
    done = console.post(
        "/signin", data={"csrf": csrf_of(page.text), "name": "al", "role": "viewer"}
    )
    assert done.url.path == "/search" and "No mail has that id" in done.text
