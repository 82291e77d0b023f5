"""Settings: defaults, environment, flags, and one-line errors that never show a secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hashq.errors import SettingsError
from hashq.settings import Settings, load_settings, redact_url


def test_defaults_are_valid() -> None:
    settings: Settings = load_settings()
    assert settings.buckets == 64
    assert settings.queue_type == "quorum"
    assert settings.app == "default"


def test_environment_is_read_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HASHQ_BUCKETS", "16")
    monkeypatch.setenv("HASHQ_APP", "orders")
    assert load_settings().buckets == 16
    assert load_settings(buckets="32").buckets == 32
    assert load_settings(buckets=None).buckets == 16
    assert load_settings().app == "orders"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("buckets", "0", "greater than or equal to 1"),
        ("buckets", "5000", "less than or equal to 4096"),
        ("buckets", "many", "valid integer"),
        ("queue_type", "stream", "'quorum' or 'classic'"),
        ("amqp_url", "http://127.0.0.1/", "amqp://"),
        ("amqp_url", "amqp://", "no host"),
        ("amqp_url", "amqp://h:99999/", "bad port"),
        ("management_url", "ftp://h", "http://"),
        ("zk_hosts", "localhost", "not host:port"),
        ("zk_hosts", "a:1,b", "not host:port"),
        ("app", "Bad App", "a-z"),
        ("app", "", "a-z"),
        ("delivery_limit", "0", "greater than or equal to 1"),
        ("connect_timeout", "-1", "greater than 0"),
        ("amqp_url", "amqp://h:1/a,amqp://h:2/b", "same vhost"),
        ("amqp_url", "amqp://h:1/,http://h:2/", "amqp://"),
        ("amqp_url", " , ", "names no URL"),
        ("management_url", "http://h:1,h2", "http://"),
        ("tls_ca_file", "/no/such/ca.pem", "not a readable file"),
    ],
)
def test_bad_value_names_the_setting_in_one_line(field: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(Settings, **{field: value})
    message = str(caught.value)
    assert "\n" not in message
    assert f"HASHQ_{field.upper()}" in message
    assert "--" + field.replace("_", "-") in message
    assert expected in message


def test_bad_environment_value_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HASHQ_QUEUE_TYPE", "lazy")
    with pytest.raises(SettingsError, match="HASHQ_QUEUE_TYPE"):
        load_settings()


def test_unknown_setting_is_refused() -> None:
    with pytest.raises(SettingsError, match="unknown setting 'bukets'"):
        load_settings(bukets=3)


def test_secrets_never_appear_in_errors() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(amqp_url="amqp://user:s3cret@host:notaport/")
    assert "s3cret" not in str(caught.value)
    with pytest.raises(SettingsError) as caught:
        load_settings(management_url="gopher://user:s3cret@host")
    assert "s3cret" not in str(caught.value)


def test_a_rule_across_settings_shows_no_input() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(amqp_url="amqp://user:s3cret@h:1/", tls_key_file=__file__)
    assert str(caught.value) == "settings: tls_key_file needs tls_cert_file"


def test_a_cluster_is_a_list_of_nodes_with_one_vhost() -> None:
    settings: Settings = load_settings(
        amqp_url="amqp://u:pw@n1:5672/orders, amqp://u:pw@n2:5672/orders",
        management_url="http://n1:15672/,http://n2:15672",
    )
    assert settings.amqp_urls == ["amqp://u:pw@n1:5672/orders", "amqp://u:pw@n2:5672/orders"]
    assert settings.management_urls == ["http://n1:15672", "http://n2:15672"]
    assert settings.vhost == "orders"
    assert settings.amqp_url_redacted == "amqp://u:***@n1:5672/orders,amqp://u:***@n2:5672/orders"


def test_settings_may_come_from_files_and_variables_win(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "HASHQ_AMQP_URL").write_text("amqp://u:from-file@h:1/\n")
    (tmp_path / "HASHQ_APP").write_text("orders")
    monkeypatch.setenv("HASHQ_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("HASHQ_APP", "billing")
    settings: Settings = load_settings()
    assert settings.amqp_url == "amqp://u:from-file@h:1/"
    assert settings.app == "billing"
    monkeypatch.setenv("HASHQ_SECRETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match=r"HASHQ_SECRETS_DIR: .* is not a directory"):
        load_settings()


def test_a_secret_file_this_user_cannot_read_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Compose mounts a secret with its mode on the host; the process runs as another user."""
    secret = tmp_path / "HASHQ_AMQP_URL"
    secret.write_text("amqp://u:p@h:1/")
    monkeypatch.setenv("HASHQ_SECRETS_DIR", str(tmp_path))
    real_read = Path.read_text

    def unreadable(path: Path, *args: Any, **kwargs: Any) -> str:
        if path.name == secret.name:
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", unreadable)  # root reads any file: pretend
    with pytest.raises(
        SettingsError,
        match=r"HASHQ_SECRETS_DIR: cannot read a secret: .*Permission denied: .*HASHQ_AMQP_URL",
    ):
        load_settings()


def test_redacted_url_hides_only_the_password() -> None:
    assert redact_url("amqp://u:p%40ss@host:5672/v") == "amqp://u:***@host:5672/v"
    assert redact_url("amqp://host/") == "amqp://host/"
    assert "p@ss" not in load_settings(amqp_url="amqp://u:p%40ss@h:1/").amqp_url_redacted


def test_vhost_and_management_credentials_come_from_the_amqp_url() -> None:
    settings: Settings = load_settings(amqp_url="amqp://alice:pw@h:5672/my%2Fvhost")
    assert settings.vhost == "my/vhost"
    assert settings.management_credentials == ("alice", "pw")
    assert load_settings(amqp_url="amqp://h:5672").vhost == "/"


def test_environment_reproduces_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings: Settings = load_settings(app="orders", buckets="16", queue_type="classic")
    for name, value in settings.environment().items():
        monkeypatch.setenv(name, value)
    assert load_settings() == settings
