"""The vllm backend's start-up check of which weight-update calls the engine has (no vLLM)."""

from sara_worker.backends.vllm_caps import plan_weight_updates


class Engine032:
    async def collective_rpc(self, *a, **k): ...
    async def pause_generation(self, *a, **k): ...
    async def resume_generation(self): ...
    async def reset_prefix_cache(self): ...
    async def sleep(self, level=1): ...
    async def wake_up(self, tags=None): ...


class EngineOld:
    async def reset_prefix_cache(self): ...


def test_new_engine_reloads_in_place_paused():
    plan = plan_weight_updates(Engine032(), "auto", True)
    assert plan.path == "reload" and "paused" in plan.reason
    assert {"sleep", "wake_up", "collective_rpc"} <= set(plan.engine_calls)
    assert "reload" in plan.line()


def test_old_engine_or_worker_rebuilds_under_auto():
    assert plan_weight_updates(EngineOld(), "auto", True).path == "rebuild"
    plan = plan_weight_updates(Engine032(), "auto", False)
    assert plan.path == "rebuild" and "reload_weights" in plan.reason
    # unknown worker support: try in place (a failed reload still falls back to a rebuild)
    assert plan_weight_updates(Engine032(), "auto", None).path == "reload"


def test_explicit_choices_are_kept():
    assert plan_weight_updates(Engine032(), "rebuild", True).path == "rebuild"
    forced = plan_weight_updates(EngineOld(), "reload", False)
    assert forced.path == "reload" and "missing" in forced.reason


def test_reload_asleep_follows_vllms_sequence():
    import asyncio

    from sara_worker.backends.vllm_caps import reload_asleep

    calls = []

    class Sleepy:
        async def sleep(self, level=1):
            calls.append(("sleep", level))

        async def wake_up(self, tags=None):
            calls.append(("wake_up", tags))

    async def load():
        calls.append(("load",))

    asyncio.run(reload_asleep(Sleepy(), load))
    assert calls == [("sleep", 2), ("wake_up", ["weights"]), ("load",),
                     ("wake_up", ["kv_cache"])]
    assert plan_weight_updates(Engine032(), "auto", True).can_sleep
    assert not plan_weight_updates(EngineOld(), "auto", True).can_sleep

