"""Local real desktops without a VM: per desktop an Xvfb display, the openbox window manager and
the OSWorld-API server (``osworld_server.py``, or OSWorld's own ``main.py`` through
``osworld_launcher.py`` when ``osworld_main`` names one) on that display, with a fresh home directory.

``LocalDesktop.start`` makes a state directory (``reaper``: named by the owner process, every
process marked), writes the home (openbox maximises every window; LibreOffice shows no tip
dialog), starts Xvfb (``-displayfd``: it picks a free display itself), openbox and the server,
and waits (polling, with a limit) until the server answers and the window manager runs. The server listens on a Unix socket in
the owner-only state directory (``listen="unix"``, the default: its ``/execute`` runs any
command and has no authentication) or on a free loopback port (``listen="tcp"``, for clients
that only speak TCP, such as OSWorld's own ``PythonController``). ``close`` (idempotent, shielded from cancellation) and a failed or
cancelled ``start`` remove every process, the display's files and the directory; the first
start of a process reaps what dead owners left.

The Debian packages (Xvfb, openbox, the apps) and the server's own small virtual environment
are installed by ``.ci/desktop.sh``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from cua_native.gym.desktop import reaper
from cua_native.gym.protocol import GymError

SERVER_SCRIPT = Path(__file__).with_name("osworld_server.py")
OSWORLD_LAUNCHER = Path(__file__).with_name("osworld_launcher.py")
REPO_ROOT = Path(__file__).resolve().parents[3]
DESKTOP_PYTHON_ENV = "CUA_DESKTOP_PYTHON"
UNIX_PATH_MAX = 107
"""The longest path a Unix socket can bind on Linux (``sun_path`` is 108 bytes with its NUL)."""
OPENBOX_RC = """<?xml version="1.0" encoding="UTF-8"?>
<openbox_config xmlns="http://openbox.org/3.4/rc">
  <applications>
    <application class="*"><maximized>true</maximized><focus>yes</focus></application>
  </applications>
</openbox_config>
"""
LIBREOFFICE_PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="WarnAlienFormat" oor:op="fuse"><value>false</value></prop></item>
</oor:items>
"""


class DesktopStartError(GymError):
    """A local desktop did not come up (a missing package, a crash, a start past its limit)."""


def default_state_root() -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / "cua_native_desktops"


def default_server_python() -> str:
    """``$CUA_DESKTOP_PYTHON``, else the repository's ``.venv-desktop`` (``.ci/desktop.sh``)."""
    return os.environ.get(DESKTOP_PYTHON_ENV) or str(REPO_ROOT / ".venv-desktop/bin/python")


@dataclass(frozen=True, slots=True)
class LocalDesktopConfig:
    width: int = 1280
    height: int = 800
    state_root: Path = field(default_factory=default_state_root)
    server_python: str = field(default_factory=default_server_python)
    start_timeout_s: float = 60.0
    window_manager: tuple[str, ...] = ("openbox",)
    listen: Literal["unix", "tcp"] = "unix"
    osworld_main: str | None = None
    """OSWorld's own ``desktop_env/server/main.py`` to serve instead of ``osworld_server.py``
    (``osworld_launcher.py``; ``server_python`` then needs its dependencies)."""
    accessibility: bool = True
    """A D-Bus session per desktop with the AT-SPI bus on it, apps exposing their widgets
    (``NO_AT_BRIDGE=0``), so ``/accessibility`` answers the real AT-SPI tree (``atspi_tree.py``
    run with ``atspi_python``); ``False``: no bus, window frames only."""
    atspi_python: str = "/usr/bin/python3"
    """A Python with Debian's ``python3-pyatspi`` (``.ci/desktop.sh`` installs it)."""


def _xauthority(path: Path, display: int, cookie: bytes) -> None:
    """An Xauthority file with one MIT-MAGIC-COOKIE-1 entry for this host's display."""

    def counted(data: bytes) -> bytes:
        return struct.pack(">H", len(data)) + data

    entry = (
        struct.pack(">H", 256)  # FamilyLocal
        + counted(socket.gethostname().encode())
        + counted(str(display).encode())
        + counted(b"MIT-MAGIC-COOKIE-1")
        + counted(cookie)
    )
    scratch = path.with_suffix(".part")
    scratch.write_bytes(entry)
    scratch.chmod(0o600)
    scratch.rename(path)


def _make_state(config: LocalDesktopConfig) -> Path:
    pid = os.getpid()
    started = reaper.start_time(pid)
    config.state_root.mkdir(parents=True, exist_ok=True)
    state = config.state_root / f"{pid}-{started}-{uuid.uuid4().hex[:8]}"
    state.mkdir(mode=0o700)
    reaper.write_manifest(state, owner_pid=pid, owner_start=started, path=str(state))
    home = state / "home"
    for sub in ("tmp", "run", "home/.config/openbox", "home/.config/libreoffice/4/user"):
        (state / sub).mkdir(parents=True, mode=0o700)
    (home / ".config/openbox/rc.xml").write_text(OPENBOX_RC)
    (home / ".config/libreoffice/4/user/registrymodifications.xcu").write_text(LIBREOFFICE_PROFILE)
    return state


def check_installed(config: LocalDesktopConfig) -> None:
    """One ``DesktopStartError`` line naming what is missing and how to install it."""
    needed = ["Xvfb", config.window_manager[0], *(["dbus-daemon"] if config.accessibility else [])]
    missing = [b for b in needed if shutil.which(b) is None]
    if config.accessibility and not Path(config.atspi_python).exists():
        missing.append(f"the accessibility tree's Python {config.atspi_python}")
    if not Path(config.server_python).exists():
        missing.append(f"the desktop server's Python {config.server_python}")
    if config.osworld_main and not Path(config.osworld_main).is_file():
        missing.append(f"OSWorld's server {config.osworld_main}")
    if missing:
        raise DesktopStartError(
            f"local desktops need {', '.join(missing)}: install them with "
            f"`bash .ci/desktop.sh` (or set {DESKTOP_PYTHON_ENV})"
        )
    # <root>/<pid>-<start time>-<8 hex>/server.sock must fit a Unix socket's path (107 bytes)
    longest = len(os.fsencode(config.state_root.resolve())) + len(
        "/4194304-99999999999-12345678/run/at-spi/dbus-12345678"  # the AT-SPI bus's socket
    )
    if config.listen == "unix" and longest > UNIX_PATH_MAX:
        raise DesktopStartError(
            f"state_root {str(config.state_root)!r} is too long for the server's Unix socket "
            f"({longest} > {UNIX_PATH_MAX} bytes): give a shorter state_root (or listen: tcp)"
        )


class LocalDesktop:
    """One running local desktop; ``url`` is its OSWorld-API server, reached over the Unix
    socket ``uds`` when that is set."""

    def __init__(self, config: LocalDesktopConfig, state: Path) -> None:
        self.config = config
        self.state = state
        self.home = state / "home"
        self.desktop_id = state.name
        self.display: int | None = None
        self.url = ""
        self.uds: str | None = None
        self._processes: list[asyncio.subprocess.Process] = []
        self._xvfb: asyncio.subprocess.Process | None = None
        self._closing: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, config: LocalDesktopConfig) -> LocalDesktop:
        """Start a desktop; on any failure or cancellation nothing of it is left."""
        check_installed(config)
        await asyncio.to_thread(reaper.reap_stale, config.state_root)
        state = await asyncio.to_thread(_make_state, config)
        desktop = cls(config, state)
        try:
            async with asyncio.timeout(config.start_timeout_s):
                await desktop._boot()
        except BaseException as exc:
            await desktop.close()
            if isinstance(exc, TimeoutError):
                raise DesktopStartError(
                    f"desktop {state.name} did not start within {config.start_timeout_s} s"
                ) from exc
            if isinstance(exc, OSError):
                raise DesktopStartError(f"desktop {state.name}: {exc}") from exc
            raise
        return desktop

    def env(self) -> dict[str, str]:
        """The environment of every process on this desktop (marked for the reaper)."""
        python_bin = str(Path(self.config.server_python).parent)
        return {
            "PATH": f"{python_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.home),
            "USER": os.environ.get("USER", "root"),
            "LANG": "C.UTF-8",
            "XDG_SESSION_TYPE": "x11",  # pyautogui.screenshot (OSWorld's server) grabs X11 then
            "TMPDIR": str(self.state / "tmp"),
            "XDG_RUNTIME_DIR": str(self.state / "run"),
            "XAUTHORITY": str(self.state / "xauthority"),
            "DISPLAY": f":{self.display}" if self.display is not None else "",
            **self._accessibility_env(),
            "GSETTINGS_BACKEND": "memory",
            reaper.MARKER: self.desktop_id,
        }

    def _accessibility_env(self) -> dict[str, str]:
        """The desktop's own D-Bus session (the AT-SPI bus is started on it when an app asks),
        apps' accessibility bridges on, and the server's way to read the tree."""
        if not self.config.accessibility:
            return {"NO_AT_BRIDGE": "1"}
        return {
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={self.state / 'run' / 'bus'}",
            "NO_AT_BRIDGE": "0",
            "GTK_MODULES": "gail:atk-bridge",  # GTK 2 apps (GTK 3 loads its bridge itself)
            "QT_ACCESSIBILITY": "1",
            "CUA_ATSPI_PYTHON": self.config.atspi_python,
        }

    async def _spawn(
        self, argv: list[str], log_name: str, **kwargs: object
    ) -> asyncio.subprocess.Process:
        log_file = await asyncio.to_thread(open, self.state / f"{log_name}.log", "wb")
        with log_file:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=self.env(),
                cwd=str(self.home),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                **kwargs,  # type: ignore[arg-type]
            )
        self._processes.append(process)
        return process

    async def _boot(self) -> None:
        cookie = secrets.token_bytes(16)
        xauth = self.state / "xauthority"
        _xauthority(xauth, 0, cookie)
        read_fd, write_fd = os.pipe()
        try:
            self._xvfb = await self._spawn(
                [
                    "Xvfb",
                    "-displayfd",
                    str(write_fd),
                    "-screen",
                    "0",
                    f"{self.config.width}x{self.config.height}x24",
                    "-auth",
                    str(xauth),
                    "-nolisten",
                    "tcp",
                    "-noreset",
                ],
                "xvfb",
                pass_fds=(write_fd,),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        # the thread owns read_fd from here: Xvfb's exit (close on a timeout) ends its read
        line = await asyncio.to_thread(_read_line_and_close, read_fd)
        if not line.strip().isdigit():
            raise DesktopStartError(f"Xvfb gave no display number: {self._log_tail('xvfb')}")
        self.display = int(line)
        (self.state / "display").write_text(str(self.display))
        reaper.write_manifest(self.state, display=self.display, xvfb_pid=self._xvfb.pid)
        _xauthority(xauth, self.display, cookie)
        if self.config.accessibility:
            bus = self.state / "run" / "bus"
            dbus = await self._spawn(
                [
                    "dbus-daemon",
                    "--session",
                    "--nofork",
                    "--nopidfile",
                    f"--address=unix:path={bus}",
                ],
                "dbus",
            )
            while not bus.exists():
                if dbus.returncode is not None:
                    raise DesktopStartError(f"dbus-daemon exited: {self._log_tail('dbus')}")
                await asyncio.sleep(0.02)
        await self._spawn(list(self.config.window_manager), "wm")
        port_file, sock = self.state / "server.port", self.state / "server.sock"
        listen = (
            ["--unix-socket", str(sock)]
            if self.config.listen == "unix"
            else ["--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file)]
        )
        script = (
            [str(OSWORLD_LAUNCHER), "--main", self.config.osworld_main]
            if self.config.osworld_main
            else [str(SERVER_SCRIPT)]
        )
        server = await self._spawn([self.config.server_python, *script, *listen], "server")
        ready = sock if self.config.listen == "unix" else port_file
        while not ready.exists():
            if server.returncode is not None:
                raise DesktopStartError(f"desktop server exited: {self._log_tail('server')}")
            await asyncio.sleep(0.05)
        if self.config.listen == "unix":
            self.url, self.uds = "http://desktop", str(sock)
        else:
            self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        transport = httpx.AsyncHTTPTransport(uds=self.uds) if self.uds else None
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), transport=transport) as client:
            await _poll(client, "GET", f"{self.url}/platform")
            # the window manager manages windows (apps started before it would not be maximised)
            await _poll(client, "POST", f"{self.url}/execute", {"command": ["wmctrl", "-m"]})

    def _log_tail(self, name: str) -> str:
        try:
            return (self.state / f"{name}.log").read_text(errors="replace")[-500:].strip()
        except OSError:
            return "(no log)"

    async def close(self) -> None:
        """Remove every process, the display's files and the state directory. Idempotent;
        cancelling ``close`` does not stop the removal."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._remove())
        await asyncio.shield(self._closing)

    async def _remove(self) -> None:
        xvfb_pid = (
            self._xvfb.pid if self._xvfb is not None and self._xvfb.returncode is None else None
        )
        await asyncio.to_thread(reaper.remove_desktop, self.state, xvfb_pid=xvfb_pid)
        for process in self._processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()


async def _poll(
    client: httpx.AsyncClient, method: str, url: str, body: dict[str, object] | None = None
) -> None:
    """Until the call answers 200 (and, for ``/execute``, the command exits 0); the caller's
    ``asyncio.timeout`` bounds it."""
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await client.request(method, url, json=body)
            if response.status_code == 200 and (
                body is None or response.json().get("returncode") == 0
            ):
                return
        await asyncio.sleep(0.05)


def _read_line_and_close(fd: int) -> str:
    """Read up to a newline or EOF (Xvfb writes its display number, then keeps the pipe open),
    then close ``fd``."""
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = os.read(fd, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return data.decode(errors="replace")
