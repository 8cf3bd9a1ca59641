"""An operator's calls live on AdminClient; a Client keeps answering the old names, with a warning."""

from __future__ import annotations

import pytest

from plancache import AdminClient, Client


def test_a_clients_admin_shares_its_connection_and_disk_cache() -> None:
    with Client("127.0.0.1:1", cache=False) as client:
        admin = client.admin
        assert isinstance(admin, AdminClient) and admin.connection is client.connection
        assert client.admin is admin  # one per client


@pytest.mark.parametrize("name", ["stats", "warm", "invalidate", "build_family", "list_targets", "explain"])
def test_the_old_admin_methods_of_client_warn_and_forward(name: str) -> None:
    with Client("127.0.0.1:1", cache=False) as client:
        with pytest.warns(DeprecationWarning, match=rf"Client\.{name}\(\) moved to AdminClient"):
            method = getattr(client, name)
        assert method == getattr(client.admin, name)


def test_a_name_neither_has_is_an_attribute_error() -> None:
    with Client("127.0.0.1:1", cache=False) as client, pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        client.nonsense  # noqa: B018


def test_an_admin_client_of_its_own_closes_its_channel_and_not_a_clients() -> None:
    with Client("127.0.0.1:1", cache=False) as client:
        AdminClient(client.connection).close()
        assert client.connection.stub is not None  # still the client's
    own = AdminClient("127.0.0.1:1")
    own.close()
