"""The paper systems, one package each, and the registry that finds them by name.

Each package's ``SYSTEM`` (a :class:`System`) names its online policies and, where it has one, its periodic
planner. The registry imports a package only when something asks for one of its names, so importing one
system imports no other. Adding a system is its own package and one line of :data:`PACKAGES`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_sidecar.core.plan import Planner
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import AccscaleError, ConfigError

# system name -> its package, in the order listings show them
PACKAGES = {
    "superserve": "scheduler_sidecar.systems.superserve",
    "ramsis": "scheduler_sidecar.systems.ramsis",
    "proteus": "scheduler_sidecar.systems.proteus",
    "loki": "scheduler_sidecar.systems.loki",
    "hybridserve": "scheduler_sidecar.systems.hybridserve",
}


@dataclass(frozen=True)
class PlannerContext:
    """What the sidecar knows when it builds a planner: its models' profiles and SLOs, its workers, and where
    a planner that deploys through a BLS model finds it."""

    profiles: Mapping[str, Profile]  # logical model -> its profile
    slo_ms: Mapping[str, float]  # logical model -> its default SLO
    workers: Sequence[tuple[int, str | None]]  # (engine worker id, device kind)
    server: Callable[[int], str]  # engine worker id -> the url of its Triton server


@dataclass(frozen=True)
class PlannerEntry:
    """A system's periodic planner as a config file names it (``[planner] kind = ...``)."""

    kind: str
    policy: str  # the policy it routes for: every model's
    keys: frozenset[str]  # the option keys it accepts
    check: Callable[[Mapping[str, Any]], Any]  # options -> settings; ConfigError names the bad one
    build: Callable[[Any, PlannerContext], Planner]  # settings -> the planner (may search for seconds)
    # True: a worker's slots are the instances of a BLS model (a pipeline, a cascade) that holds a batch
    # through every hop; False: a worker is one device running one batch at a time
    bls_slots: bool = False
    one_model: bool = False  # it plans one logical model, the sidecar's only one

    def settings(self, options: Mapping[str, Any]) -> Any:
        unknown = sorted(set(options) - self.keys)
        if unknown:
            raise ConfigError(f"planner: unknown options {unknown}; known: {sorted(self.keys)}")
        try:
            return self.check(options)
        except ConfigError:
            raise
        except (TypeError, ValueError, KeyError, OSError) as exc:
            raise ConfigError(f"planner: {self.kind}: {exc}") from None


@dataclass(frozen=True)
class System:
    """One paper's runtime: its online policies and its planner."""

    name: str
    policies: tuple[type[Policy], ...]
    planner: PlannerEntry | None = None


def system(name: str) -> System:
    if name not in PACKAGES:
        raise ConfigError(f"unknown system {name!r}; choose one of {list(PACKAGES)}")
    return importlib.import_module(PACKAGES[name]).SYSTEM


def systems() -> list[System]:
    return [system(name) for name in PACKAGES]


def policies() -> dict[str, type[Policy]]:
    """Every online policy by name (imports every system)."""
    return {p.name: p for s in systems() for p in s.policies}


def policy_class(name: str) -> type[Policy]:
    for candidate in PACKAGES:  # a system at a time: a known name imports the systems up to its own
        for p in system(candidate).policies:
            if p.name == name:
                return p
    raise ConfigError(f"unknown policy {name!r}; choose one of {sorted(policies())}")


def planner(kind: str) -> PlannerEntry:
    entries = {s.planner.kind: s.planner for s in systems() if s.planner is not None}
    if kind not in entries:
        raise ConfigError(f"planner: unknown kind {kind!r}; choose one of {list(entries)}")
    return entries[kind]


def routes_for_planner(policy: str) -> bool:
    """Whether a policy serves only by a planner's plans (proteus, loki, cascade); imports the systems up to its own,
    as policy_class does."""
    for name in PACKAGES:
        owner = system(name)
        if any(p.name == policy for p in owner.policies):
            return owner.planner is not None and owner.planner.policy == policy
    raise ConfigError(f"unknown policy {policy!r}; choose one of {sorted(policies())}")


def make_policy(name: str, profile: Profile, **options: object) -> Policy:
    """The policy ``name`` built for ``profile``; options it does not take, or refuses, are a ConfigError."""
    cls = policy_class(name)
    try:
        return cls(profile, **options)
    except AccscaleError:
        raise
    except (TypeError, ValueError) as exc:  # an option the constructor does not take, or refuses
        raise ConfigError(f"policy {name!r}: {exc}") from None


def option_names(cls: type[Policy]) -> frozenset[str]:
    """The keyword options a policy's constructors take, down its bases while each passes ``**options`` on."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names |= {p.name for p in params if p.kind is p.KEYWORD_ONLY or
                  (p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "profile"))}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return frozenset(names)


__all__ = ["PACKAGES", "PlannerContext", "PlannerEntry", "System", "make_policy", "option_names", "planner", "policies",
           "policy_class", "routes_for_planner", "system", "systems"]
