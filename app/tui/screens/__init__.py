"""The console's screens: main, help, cache inspector, settings, sessions, compare."""
