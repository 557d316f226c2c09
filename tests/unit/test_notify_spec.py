"""The contract's `notify` block: targets, a secret only by environment variable, and
times; what a task's notifier is made of."""

from __future__ import annotations

from typing import Any

import pytest

from tether import errors
from tether.runtime.watch.sinks import Fanout, LogNotifier, WebhookNotifier, for_task
from tether.spec import WebhookTarget, parse_spec


def _spec(notify: Any) -> Any:
    return parse_spec({"objective": "o", "items": [{"id": "a", "title": "a"}], "notify": notify})


def test_targets_admin_and_times_parse() -> None:
    notify = _spec(
        {
            "targets": ["log", {"webhook": "https://hooks.example/t", "secret_env": "HOOK_KEY"}],
            "admin": [{"webhook": "https://hooks.example/admin"}],
            "renotify_after": 600,
            "suspend_after": 7200,
        }
    ).notify
    assert notify.targets[0] == "log"
    assert notify.targets[1] == WebhookTarget(
        webhook="https://hooks.example/t", secret_env="HOOK_KEY"
    )
    assert (notify.renotify_after, notify.suspend_after) == (600, 7200)
    assert _spec({}).notify.renotify_after is None  # the installation's default


@pytest.mark.parametrize(
    ("notify", "says"),
    [
        ({"targets": [{"webhook": "https://h/x", "secret": "s3cret"}]}, "secret: unknown field"),
        ({"targets": [{"webhook": "ftp://h/x"}]}, "http(s) URL"),
        ({"targets": [{"webhook": "https://h/x", "secret_env": "not a name"}]}, "secret_env"),
        ({"targets": ["email"]}, "targets.0"),
        ({"renotify_after": 0}, "renotify_after"),
    ],
)
def test_bad_notify_blocks_are_refused(notify: Any, says: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        _spec(notify)
    assert says in str(info.value)


def test_a_tasks_notifier_adds_the_contracts_targets_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOOK_KEY", "k")
    notify = _spec(
        {
            "targets": [
                "log",
                {"webhook": "https://h/team", "secret_env": "HOOK_KEY"},
                {"webhook": "https://h/team"},
            ],
            "admin": [{"webhook": "https://h/admin"}],
        }
    ).notify
    base = LogNotifier()
    plain = for_task(base, notify)
    assert isinstance(plain, Fanout) and len(plain.notifiers) == 2  # log once, team once
    team = plain.notifiers[1]
    assert isinstance(team, WebhookNotifier) and team.secret == "k"
    admin = for_task(base, notify, admin=True)
    assert isinstance(admin, Fanout)
    assert [getattr(n, "url", "log") for n in admin.notifiers] == [
        "log",
        "https://h/team",
        "https://h/admin",
    ]
    assert for_task(base, _spec({}).notify) is base
