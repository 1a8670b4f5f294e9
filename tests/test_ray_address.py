"""Where a driver finds a cluster's token (Ray's own order), and the one-line answers of a probe
that needs no cluster: the ``ray start`` cluster itself is in ``test_ray_start``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from commprof import ray_address


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_the_token_is_found_where_ray_reads_it(
    no_token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ray_address.token_source() is None
    default = no_token / ".ray" / "auth_token"
    default.parent.mkdir()
    default.write_text("\n")  # empty: no token
    assert ray_address.token_source() is None
    default.write_text("abc\n")
    assert ray_address.token_source() == str(default)
    named = no_token / "elsewhere"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(named))
    assert ray_address.token_source() is None  # the named file wins, and it is missing
    named.write_text("def")
    assert ray_address.token_source() == str(named)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ghi")
    assert ray_address.token_source() == "RAY_AUTH_TOKEN"


def test_a_mode_the_user_set_is_kept(no_token: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ray_address.use_token_auth() is False
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert ray_address.use_token_auth() is True


def test_no_token_leaves_the_mode_unset(no_token: Path) -> None:
    import os

    assert ray_address.use_token_auth() is False
    assert "RAY_AUTH_MODE" not in os.environ


def test_a_closed_port_is_unreachable_and_attach_says_what_to_do(no_token: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused at once
        assert ray_address.probe(address) == "unreachable"
        with pytest.raises(
            ConnectionError, match=r"no Ray cluster answers at 127\.0\.0\.1:.*RAY_ADDRESS"
        ):
            ray_address.attach(address)


def test_a_token_at_hand_stays_unused_for_a_cluster_that_asks_for_none(
    no_token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    # a token at hand, as on any machine where an embedded Ray once ran; the cluster did not ask
    # for it (here: nothing answers), so the process keeps Ray's authentication off: on, it
    # refuses the calls of a cluster without authentication, which then destroys its actors
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert ray_address.negotiate(f"127.0.0.1:{s.getsockname()[1]}") == "unreachable"
    assert "RAY_AUTH_MODE" not in os.environ
