"""What the planner noticed while planning: the reference's warnings and info lines."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PlanLog:
    """An ordered list of ``(level, message)`` the plan keeps for reports."""

    entries: list[tuple[str, str]] = field(default_factory=list)

    def info(self, message: str) -> None:
        self.entries.append(("INFO", message))

    def warning(self, message: str) -> None:
        self.entries.append(("WARNING", message))

    def messages(self, level: str | None = None) -> list[str]:
        return [m for lv, m in self.entries if level is None or lv == level]
