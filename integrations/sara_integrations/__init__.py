"""Bridges between SARA and other libraries, apart from the SDK so that `sara_client` needs only
httpx and pydantic: prompt files and Hugging Face datasets as prompts (`data`), and adapters that
put SARA's allocation into TRL, verl and OpenRLHF (`trl`, `verl`, `openrlhf`; each needs its
library, and torch)."""
