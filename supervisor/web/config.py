"""What ``supervisor web`` was asked to do: parsed by the CLI, checked by ``validate()``."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

PORT_RANGE = (0, 65535)  # 0: any free port (printed)
REFRESH_RANGE = (0.2, 3600.0)  # seconds between two polls of a page's live part
TOKEN_LENGTH = (8, 1024)


@dataclass(frozen=True)
class WebConfig:
    db: str
    host: str = "127.0.0.1"
    port: int = 8000
    pidfile: str | None = None
    chaos_report: str | None = None
    read_only: bool = False
    token: str | None = None
    refresh: float = 2.0

    def validate(self) -> WebConfig:
        """Raise ConfigError naming the first option that cannot work; return self."""
        low, high = PORT_RANGE
        checks = [
            (bool(self.db.strip()), "--db must name a database file or URL"),
            (bool(self.host.strip()), "--host must name an address"),
            (low <= self.port <= high, f"--port must be between {low} and {high} (0: any)"),
            (
                REFRESH_RANGE[0] <= self.refresh <= REFRESH_RANGE[1],
                f"--refresh must be between {REFRESH_RANGE[0]:g} and {REFRESH_RANGE[1]:g} s",
            ),
            (
                self.token is None or TOKEN_LENGTH[0] <= len(self.token) <= TOKEN_LENGTH[1],
                f"--token must be {TOKEN_LENGTH[0]} to {TOKEN_LENGTH[1]} characters long",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return self
