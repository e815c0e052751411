"""The Redis store: one Lua script per transition, the key names and the stored encodings."""
