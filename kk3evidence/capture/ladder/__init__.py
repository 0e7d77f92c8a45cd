"""``ladder PLAN``: run a one-variable-at-a-time plan, one bundle per step."""
