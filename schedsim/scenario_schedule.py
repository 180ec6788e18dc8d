"""``[schedule]`` of a scenario file: a generator name and its parameters (checked
against the generator and the comm policy), or a program / schedule file to load.
:class:`schedsim.scenario.Scenario` holds it as its ``schedule`` table."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schedsim.errors import ScenarioError


class ScheduleSection(BaseModel):
    """``[schedule]``: a generator name and its parameters, or a file to load."""

    model_config = ConfigDict(extra="allow", defer_build=True)

    name: str | None = None
    ranks: int | None = Field(default=None, ge=1)
    microbatches: int | None = Field(default=None, ge=1)
    comm_policy: str | None = None
    program: str | None = None
    schedule_file: str | None = None
    placement: str | None = None
    stages: int | None = Field(default=None, ge=1)

    def generator_params(self) -> dict[str, Any]:
        """Generator and policy parameters (``max_batch_ops``: any program's, below)."""
        return {k: v for k, v in (self.model_extra or {}).items() if k != "max_batch_ops"}

    def check_keys(self, flags: dict[tuple[str, str], str] | None = None) -> None:
        """Refuse a key that neither this table, the generator ``name`` nor the comm
        policy (``comm_policy``, default ``async``) takes, as a :class:`ScenarioError`
        naming it with the closest key (``microbatchs`` -> ``microbatches``) and the keys
        taken; a :class:`~schedsim.errors.FlagError` naming the flag when a command-line
        flag set it (``flags``: ``(table, key)`` -> the flag's field name, ``param`` for
        ``--param``). A key another policy takes, or another tool's name for one of ours, is left
        to :func:`~schedsim.generators.build_program`, whose message says which; so is an
        unknown schedule or policy name."""
        extra = [k for k in (self.model_extra or {}) if k != "max_batch_ops"]
        if not extra:
            return
        from schedsim.errors import ScheduleError
        from schedsim.generators import foreign_key_hint, get
        from schedsim.program.lower import get_policy, policy_of_param

        try:
            pol = list(get_policy(self.comm_policy or "async").params)
            gen = [k for k in get(self.name).accepted() if k not in ("costs", "link")] \
                if self.name else []
        except ScheduleError:
            return
        taken = set(gen) | set(pol)
        bad = [k for k in extra
               if k not in taken and not policy_of_param(k) and foreign_key_hint(k) is None]
        if not bad:
            return
        from schedsim.util.suggest import did_you_mean

        k = bad[0]
        own = [f for f in type(self).model_fields] + ["max_batch_ops"]
        policy = f"comm policy {self.comm_policy or 'async'!r}"
        who, takes = ((f"schedule {self.name!r}", f"{', '.join(gen) or 'none'}; {policy}: "
                       f"{', '.join(pol) or 'none'}") if self.name else
                      (policy, ", ".join(pol) or "none"))
        why = f"{who} takes no parameter {k!r} (it takes: {takes}; the table: {', '.join(own)})"
        flag = (flags or {}).get(("schedule", k))
        if flag is not None:
            from schedsim.errors import FlagError

            raise FlagError(flag, (f"{k}{did_you_mean(k, own + gen + pol)}: " if flag ==
                                   "param" else "") + why)
        raise ScenarioError(f"[schedule] unknown key {k!r}{did_you_mean(k, own + gen + pol)}"
                            f": {why}")
