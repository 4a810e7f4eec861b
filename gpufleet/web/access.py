"""Who sees what on the owners' service: an owner their own jobs, a team's members and leads the
team's, operators everything (SQL included). Enforced on every query the service makes
(``Viewer.where`` is part of each one's ``WHERE``), never by hiding links; a job the asker may
not see is answered exactly as one that does not exist.

Team membership comes from a mapping file, from Slurm's accounts and associations (a user's
associations are the teams they are a member of; an account's coordinators its leads), or
both; the operators are named users and the members of configured Unix groups. A mapping file
(TOML; ``docs/operating.md``)::

    operators = ["alice"]            # users who see the whole fleet
    operator_groups = ["gpu-ops"]    # and every member of these Unix groups

    [teams.vision]
    members = ["ana", "bo"]
    leads = ["carla"]                # sponsors: they see the team's jobs and get its report
"""

from __future__ import annotations

import grp
import pwd
import subprocess
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from schemas.validate_ids import id_error


@dataclass(frozen=True)
class Viewer:
    """Who asks, and what they may see; ``via``: how they were told (proxy, munge, development)."""

    user: str
    teams: frozenset[str] = frozenset()  # teams whose jobs they see (member or lead)
    leads: frozenset[str] = frozenset()  # teams they lead
    operator: bool = False
    via: str = "proxy"

    def sees(self, owner: str | None, team: str | None) -> bool:
        return self.operator or (owner is not None and owner == self.user) or (team is not None and team in self.teams)

    def where(self, owner: str = "owner", team: str = "team") -> tuple[str, dict]:
        """The condition (and its parameters) that keeps a query to the rows this viewer may see."""
        if self.operator:
            return "1", {}
        return (f"(ifNull({owner}, '') = %(viewer_user)s OR ifNull({team}, '') IN %(viewer_teams)s)",
                {"viewer_user": self.user, "viewer_teams": sorted(self.teams) or [""]})

    @property
    def role(self) -> str:
        return "operator" if self.operator else ("team lead" if self.leads else "owner")


class DirectoryError(ValueError):
    """A mapping file that cannot be used; the text says where and why."""


@dataclass
class Team:
    members: set[str] = field(default_factory=set)
    leads: set[str] = field(default_factory=set)


class Directory:
    """Teams and operators, from a mapping file and (with ``slurm``) Slurm's accounting, read
    again at most every ``refresh_s``."""

    def __init__(self, teams: dict[str, Team] | None = None, operators: frozenset[str] = frozenset(),
                 operator_groups: tuple[str, ...] = (), slurm: bool = False, refresh_s: float = 60.0) -> None:
        self.teams, self.operators, self.operator_groups = teams or {}, operators, operator_groups
        self.slurm, self.refresh_s = slurm, refresh_s
        self._slurm_teams: dict[str, Team] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path | None, operators: tuple[str, ...] = (), operator_groups: tuple[str, ...] = (),
             slurm: bool = False) -> Directory:
        raw: dict = {}
        if path is not None:
            try:
                raw = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise DirectoryError(f"{path}: {exc}") from None
        teams = {}
        for name, entry in (raw.get("teams") or {}).items():
            if id_error("team", name) or not isinstance(entry, dict):
                raise DirectoryError(f"{path}: [teams.{name}] is not a team id with members and leads")
            teams[name] = Team(set(_names(entry.get("members", []), f"teams.{name}.members", path)),
                               set(_names(entry.get("leads", []), f"teams.{name}.leads", path)))
        users = frozenset((*operators, *_names(raw.get("operators", []), "operators", path)))
        groups = (*operator_groups, *_names(raw.get("operator_groups", []), "operator_groups", path))
        return cls(teams, users, tuple(groups), slurm)

    def viewer(self, user: str, via: str) -> Viewer:
        teams = {**self._from_slurm()}
        for name, team in self.teams.items():
            known = teams.setdefault(name, Team())
            known.members |= team.members
            known.leads |= team.leads
        member = frozenset(n for n, t in teams.items() if user in t.members or user in t.leads)
        leads = frozenset(n for n, t in teams.items() if user in t.leads)
        return Viewer(user, member, leads, self.is_operator(user), via)

    def is_operator(self, user: str) -> bool:
        if user in self.operators:
            return True
        for name in self.operator_groups:
            try:
                group = grp.getgrnam(name)
            except KeyError:
                continue
            if user in group.gr_mem:
                return True
            try:
                if pwd.getpwnam(user).pw_gid == group.gr_gid:
                    return True
            except KeyError:
                pass
        return False

    def leads_of(self) -> dict[str, set[str]]:
        """Each team's leads (the sponsors of the periodic reports)."""
        teams = self._from_slurm()
        return {n: set(t.leads) | set(teams.get(n, Team()).leads) for n, t in {**teams, **self.teams}.items()}

    def _from_slurm(self) -> dict[str, Team]:
        if not self.slurm:
            return {}
        with self._lock:
            if time.monotonic() - self._read_at < self.refresh_s:
                return {n: Team(set(t.members), set(t.leads)) for n, t in self._slurm_teams.items()}
            self._slurm_teams = slurm_teams()
            self._read_at = time.monotonic()
            return {n: Team(set(t.members), set(t.leads)) for n, t in self._slurm_teams.items()}


def _names(value, where: str, path: Path | None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DirectoryError(f"{path}: {where} must be a list of user or group names")
    return value


def slurm_teams(sacctmgr: str = "sacctmgr") -> dict[str, Team]:
    """Slurm's accounts as teams: their users' associations the members, their coordinators the
    leads. An accounting that cannot be read gives no teams (and owners still see their own)."""
    teams: dict[str, Team] = {}
    try:
        assoc = subprocess.run([sacctmgr, "--noheader", "--parsable2", "show", "associations", "format=account,user"],
                               capture_output=True, text=True, timeout=10, check=True).stdout
        coords = subprocess.run([sacctmgr, "--noheader", "--parsable2", "show", "accounts", "withcoordinators",
                                 "format=account,coordinators"], capture_output=True, text=True, timeout=10,
                                check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return teams
    for line in assoc.splitlines():
        account, _, user = line.partition("|")
        if account and user:
            teams.setdefault(account, Team()).members.add(user)
    for line in coords.splitlines():
        account, _, names = line.partition("|")
        for name in filter(None, names.split(",")):
            teams.setdefault(account, Team()).leads.add(name)
    return teams
