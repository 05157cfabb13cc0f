"""Typed, frozen configuration: ``load(path, env, flags)`` and a validation listing every problem.

Precedence: command-line flag > environment > config file > default (docs/real-fleet.md,
"Configuration").
Secrets come only from the environment or a ``.env`` file next to the config file, never from the
TOML. Settings can also be given in the environment as ``VULTRSCALE_<SECTION>_<KEY>``
(``VULTRSCALE_POLICY_MAX_INSTANCES=3``).

Each setting is declared once, in ``schema`` (its type, default, range or pattern, help); the
package is cut by job: ``values`` (durations, values as text), ``kinds`` (how a setting is
declared and checked on its own), ``schema`` (the sections), ``secrets`` (the secrets and the
other variables), ``model`` (the resolved :class:`Config`), ``files`` (the TOML file and the
.env), ``load`` (flags > environment > file > defaults), ``checks`` (the rules relating several
settings, and the warnings of ``config check``), ``reference`` (init's template, .env.example
and docs/reference/settings.md, written from the schema; imported only by what writes them).
The names below are the ones other modules import from ``vultrscale.config``.
"""

from __future__ import annotations

from vultrscale.config.checks import WorkerLogin, queue_warnings, validate, worker_login
from vultrscale.config.files import DEFAULT_CONFIG_NAME, read_dotenv, resolve_config_path
from vultrscale.config.kinds import (
    PLAN_FORM,
    QUEUE_NAME,
    QUEUE_NAME_FORM,
    SERVICE_NAME,
    VULTR_ID,
    VULTR_ID_FORM,
    WaitTarget,
    cron_problem,
    queue_name_problem,
)
from vultrscale.config.load import check_text, load, setting_key_problem
from vultrscale.config.model import Config
from vultrscale.config.schema import (
    FORECAST_MODES,
    MAX_FLEET,
    PRESETS,
    AccountConfig,
    BudgetConfig,
    DrainConfig,
    FleetConfig,
    FloorConfig,
    ForecastConfig,
    Offering,
    PolicyConfig,
    QueueConfig,
    SimulateConfig,
    WorkerConfig,
    setting_keys,
)
from vultrscale.config.secrets import (
    DEFAULT_API_URL,
    MAX_API_KEY,
    SECRET_NAMES,
    Secret,
    Secrets,
    api_url_problem,
)
from vultrscale.core.values import (
    DURATION_FORM,
    MAX_DURATION,
    duration_range,
    format_duration,
    parse_duration,
    shown,
    to_duration,
    toml_value,
)
from vultrscale.errors import ConfigError, UsageError
from vultrscale.redaction import mask_url, url_password
from vultrscale.workerunit import (
    RESTART_SECONDS,
    START_LIMIT_BURST,
    outage_budget,
    start_limit_interval_seconds,
    timeout_stop_seconds,
)

__all__ = [
    "DEFAULT_API_URL",
    "DEFAULT_CONFIG_NAME",
    "DURATION_FORM",
    "FORECAST_MODES",
    "MAX_API_KEY",
    "MAX_DURATION",
    "MAX_FLEET",
    "PLAN_FORM",
    "PRESETS",
    "QUEUE_NAME",
    "QUEUE_NAME_FORM",
    "RESTART_SECONDS",
    "SECRET_NAMES",
    "SERVICE_NAME",
    "START_LIMIT_BURST",
    "VULTR_ID",
    "VULTR_ID_FORM",
    "AccountConfig",
    "BudgetConfig",
    "Config",
    "ConfigError",
    "DrainConfig",
    "FleetConfig",
    "FloorConfig",
    "ForecastConfig",
    "Offering",
    "PolicyConfig",
    "QueueConfig",
    "Secret",
    "Secrets",
    "SimulateConfig",
    "UsageError",
    "WaitTarget",
    "WorkerConfig",
    "WorkerLogin",
    "api_url_problem",
    "check_text",
    "cron_problem",
    "duration_range",
    "format_duration",
    "load",
    "mask_url",
    "outage_budget",
    "parse_duration",
    "queue_name_problem",
    "queue_warnings",
    "read_dotenv",
    "resolve_config_path",
    "setting_key_problem",
    "setting_keys",
    "shown",
    "start_limit_interval_seconds",
    "timeout_stop_seconds",
    "to_duration",
    "toml_value",
    "url_password",
    "validate",
    "worker_login",
]
