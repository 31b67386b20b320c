"""Shared fixtures of the ACL and TLS tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    """A throwaway CA (``trustme``) and the PEM files the TLS tests use, by name."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("slave.example")
    paths = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "server.pem",
        "key": tmp_path / "server.key",
        "client_cert": tmp_path / "client.pem",
        "client_key": tmp_path / "client.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    other = trustme.CA()  # a CA nobody trusts
    stranger = other.issue_cert("127.0.0.1")
    stranger.cert_chain_pems[0].write_to_path(str(tmp_path / "stranger.pem"))
    stranger.private_key_pem.write_to_path(str(tmp_path / "stranger.key"))
    other.cert_pem.write_to_path(str(tmp_path / "stranger-ca.pem"))
    return {k: str(v) for k, v in paths.items()} | {
        "stranger_cert": str(tmp_path / "stranger.pem"),
        "stranger_key": str(tmp_path / "stranger.key"),
        "stranger_ca": str(tmp_path / "stranger-ca.pem"),
    }
