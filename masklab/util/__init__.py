"""Small utilities every layer uses: errors, the one registry, config flags, files, the device."""
