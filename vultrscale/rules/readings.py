"""What one pass read, as one frozen value: ``Readings``. The read stage (``vultrscale.read``)
builds it whole, the decision (``vultrscale.rules.decision``) reads it and nothing else.

What could not be read is in the value as the error that said so (the cloud's, the queue's),
never guessed; its words are made here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from vultrscale.core.model import (
    AccountSpend,
    FleetState,
    LedgerRow,
    PlanPrice,
    ServiceState,
    Signals,
    WorkerView,
)

if TYPE_CHECKING:
    from vultrscale.core.forecast import Profile
    from vultrscale.errors import DatabaseError, UsageError
    from vultrscale.rules.offerings import OfferingCheck, OfferingView
    from vultrscale.vultr.errors import VultrError
    from vultrscale.vultr.models import VInstance


@dataclass(frozen=True, slots=True)
class Readings:
    """Everything one pass read, before deciding anything. Reading writes nothing."""

    now: datetime
    rows: Mapping[str, LedgerRow]  # the ledger's rows not gone, by label
    gone: tuple[LedgerRow, ...]  # rows gone this month (their cost is in this month's bill)
    listed: Mapping[str, VInstance]  # by label: the tagged list, plus what a GET found it miss
    workers: Mapping[str, WorkerView]
    signals: Signals | None
    price: PlanPrice | None
    state: FleetState
    probes: Mapping[str, ServiceState | str]  # draining rows: is-active, or why it wasn't asked
    signal_error: DatabaseError | None = None  # the queue's signals could not be read
    api_error: VultrError | None = None  # the cloud could not be read: the pass holds
    # By plan: the fleet plan's price and those of the instances adopted this pass on another
    # plan (made by hand: each is billed at its own plan's price, not the fleet's).
    prices: Mapping[str, PlanPrice] = field(default_factory=dict)
    price_error: str | None = None  # an adopted instance's plan Vultr lists without a price
    # The plan, its region or its price refused: nothing may be created this pass.
    refused: UsageError | None = None
    # The fleet's offerings in order, each usable or skipped and why (docs/offerings.md);
    # empty: not checked (readings made without them), the fleet's one plan at ``price``.
    offerings: tuple[OfferingView, ...] = ()
    # The floor forecast's profile (cached or just computed); None: off or none yet.
    forecast: Profile | None = None
    # The fleet's newest boots, older ones too (``StoredReads.boots``): the boot time's.
    boots: tuple[LedgerRow, ...] = ()
    # The account's other fleets' spend (account.monthly_ceiling_usd set); None: no ceiling.
    account: AccountSpend | None = None
    # What this pass learnt that the ledger does not hold yet, for the pass to remember: the
    # offerings it asked Vultr about, and a forecast profile newer than the ledger's.
    new_checks: tuple[OfferingCheck, ...] = ()
    new_profile: Profile | None = None

    @property
    def api_problem(self) -> str | None:
        """The cloud's error as the pass reports it; None: the cloud was read."""
        return None if self.api_error is None else f"Vultr API: {self.api_error}"

    @property
    def signal_misconfigured(self) -> bool:
        """The signals could not be read because the queue preset does not match the database
        (its library's tables missing, or of a version it does not read): the pass holds the
        fleet as for any signal error, and ends with exit 2, a configuration error."""
        from vultrscale.errors import EXIT_USAGE

        return self.signal_error is not None and self.signal_error.exit_code == EXIT_USAGE

    @property
    def signal_problem(self) -> str | None:
        """The queue's error as the pass reports it; None: the signals were read."""
        return None if self.signal_error is None else f"queue signals: {self.signal_error}"
