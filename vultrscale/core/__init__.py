"""The values every layer shares and the pure functions below the config: the model of a
fleet and a pass, limits as values, durations, the clock, the floor forecast's profile and
the learned boot time. Imports nothing of vultrscale above ``errors``."""
