"""cua_native."""
