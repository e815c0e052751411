"""The scheduler: each API call as store transitions decided by the math, with what feeds it."""
