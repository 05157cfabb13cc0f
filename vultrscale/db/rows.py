"""The ledger's rows as the pass reads them: every column of ``fleet_instances`` a
``LedgerRow`` holds, in its order, and the cursor's rows made LedgerRows (``db.ledger`` reads
the fleet's own, ``db.account`` the other fleets')."""

from __future__ import annotations

from typing import Any

import psycopg

from vultrscale.core.model import InstanceState, LedgerRow

COLUMNS = (
    "label, fleet, state, instance_id, plan, region, hourly_rate, monthly_cost, host_key, "
    "main_ip, internal_ip, created_at, posted_at, active_at, running_at, draining_at, "
    "deleting_at, gone_at, state_since, delete_attempts, last_error, never_revive"
)
_FIELDS = tuple(c.strip() for c in COLUMNS.split(","))
_STATES = {s.value: s for s in InstanceState}


def ledger_rows(cur: psycopg.Cursor[Any]) -> list[LedgerRow]:
    # Plain tuples, each made a LedgerRow in one step: a pass reads every row of the fleet.
    fields, states, new, out = _FIELDS, _STATES, object.__new__, []
    for t in cur.fetchall():
        row = new(LedgerRow)
        values = row.__dict__  # frozen_from, inlined: this loop runs per row per pass
        values.update(zip(fields, t, strict=True))
        values["state"] = states[values["state"]]
        out.append(row)
    return out
