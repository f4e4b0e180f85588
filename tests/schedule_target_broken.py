"""A task module that fails at import with something other than ImportError (a setting
its environment lacks): the schedules' system check must report it, not crash."""

raise KeyError("SETTING_THIS_ENVIRONMENT_LACKS")
