"""The console's operation search at scale, alone: p95 of the search page for the superuser
(every tenant) and for one tenant's staff, rare, common and absent texts (ADR 0018).

    DATABASE_URL=postgres://…/x SCALE_DB=bench_search python -m bench.search_probe [rows]

Fills ``SCALE_DB`` with ``bench.scale``'s generator (reused when it holds the same fill), then
times each search page ``SCALE_REPEAT`` times through the console (Django's test client, in
process): the superuser, the staff of the big tenant (9 rows in 10) and of a small one (1 in
90). Keys are ``ord-<i>-<md5 8>``: ``ord-1`` is in one key in nine (the regression that joined
and sorted every match), a middle part of one key is in one key, provider references ``ch_…``
are on 98 % of rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from bench import scale


def _p95(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))]


def child(rows: int) -> None:
    os.environ["DATABASE_URL"] = scale._url(scale.BIG_DB)
    os.environ.setdefault("OUTBOUND_ALLOW", "127.0.0.1:9")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "0")
    import django

    django.setup()
    import logging

    logging.getLogger("onceguard").setLevel(logging.ERROR)
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client
    from django.urls import reverse

    from ledger.models import Operation, Tenant
    from review.models import StaffTenant

    filled = scale.fill(rows)
    how = f"filled in {filled:.0f} s" if filled else "reused"
    print(f"{scale.BIG_DB}: {rows:,} operations ({how})", flush=True)
    big = Tenant.objects.get(slug=scale.BIG)
    known = Operation.objects.filter(tenant=big).order_by("id").values("key", "provider_ref")[rows // 3]
    users = get_user_model()
    root = users.objects.filter(username="probe-root").first() or users.objects.create_superuser(
        "probe-root", "probe@example.invalid", None
    )

    def staff_of(tenant: Tenant) -> Any:
        name = f"probe-{tenant.slug}"
        user = users.objects.filter(username=name).first()
        if user is None:
            user = users.objects.create_user(name, is_staff=True)
            user.groups.add(*Group.objects.all())
            StaffTenant.objects.create(user=user, tenant=tenant)
        return user

    small = Tenant.objects.get(slug=scale.SMALL_TENANT)
    url = reverse("admin:ledger_operation_changelist")
    texts = {
        "common ord-1": "ord-1",
        "rare key part": known["key"][4:12],
        "none": "zzzz-nothing",
        "ref prefix common ch_": "ch_",
        "ref prefix rare": known["provider_ref"][:10],
    }
    for who, user in (("superuser", root), ("big tenant", staff_of(big)), ("small tenant", staff_of(small))):
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(user)
        for name, text in texts.items():
            timings = []
            for _ in range(scale.REPEAT):
                started = time.perf_counter()
                response = client.get(url, {"q": text})
                timings.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, (who, name, response.status_code)
            print(
                f"{who:<13} {name:<24} q={text!r:<26} p95 {_p95(timings):8.1f} ms  median {sorted(timings)[len(timings) // 2]:8.1f} ms",
                flush=True,
            )


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
        return 0
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    scale.prepare(scale.BIG_DB)
    return subprocess.run([sys.executable, "-m", "bench.search_probe", "--child", str(rows)]).returncode


if __name__ == "__main__":
    raise SystemExit(main())
