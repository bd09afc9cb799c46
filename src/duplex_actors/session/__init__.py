"""Sessions: the pure session core (sans-io) and the Trio actor that drives it."""
