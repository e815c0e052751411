"""Prompt selections: which prompts the next groups open on (SARA_SELECTION).

Every selection draws from the epoch queue without replacement and passes over prompts with a
group in flight (`draws.PromptDraws`). What differs is behind this interface:

- `draw(count)`: the next prompts, and the policy version a ranking used (-1: epoch order);
- `give_back(pids, ranked_at)`: prompts drawn that flow control had no room to open;
- `kept(posts, version, clock)`: a filter before any rollout (history, GRESO); skipped prompts
  count as `groups_skipped`;
- `scores(pids, posts, version)`: a ranking's score per candidate (dps, mopps);
- `reads_history`: whether choosing reads the prompts' posteriors (then the lease script cannot
  open groups on its own: see `Scheduler._opening`);
- `stats()`: what it adds to /stats' `strategy` (GRESO's rates, a ranked round);
- `settings_class`: its own settings (strategy_settings), if it has any.

The pure rules (DPS's transition model, MoPPS's Thompson score, GRESO's keep chance) live in
`math/selection.py`.
"""

from __future__ import annotations

import random

from ...settings import Settings
from ...store.store import Store
from ..planning import Planner
from .base import Ranked, Selection
from .dps import Dps
from .greso import Greso
from .history import History
from .mopps import Mopps

__all__ = ["SELECTIONS", "Ranked", "Selection", "selection_for"]

SELECTIONS: dict[str, type[Selection]] = {
    "epoch": Selection, "history": History, "greso": Greso, "dps": Dps, "mopps": Mopps,
}


def selection_for(settings: Settings, store: Store, planner: Planner,
                  rng: random.Random) -> Selection:
    """The run's prompt selection (SARA_SELECTION)."""
    return SELECTIONS[settings.selection](settings, store, planner, rng)
