"""The allocation math, pure: no Redis, no HTTP; clock and randomness are passed in."""
