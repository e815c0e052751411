"""SARA scheduler: sequential adaptive rollout allocation over Redis."""
