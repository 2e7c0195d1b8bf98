"""Real Linux desktops through OSWorld's desktop-server API (``docs/desktop.md``)."""
