"""The labelled scenarios of the diagnosis (issue 26): known causes injected against real
peers on loopback, each with the finding that must come first and those that must not appear."""
