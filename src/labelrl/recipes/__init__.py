"""Built-in ladder recipes (versioned YAML): `labelrl ladder demo`, `labelrl ladder gpu`."""
