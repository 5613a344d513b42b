"""The hook contract: the hook specs, the records hooks speak in, the public marker, contract versions."""
