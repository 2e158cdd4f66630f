"""Errors that the CLI turns into a message and an exit status (no traceback)."""


class ClusterbakeError(Exception):
    exit_code = 1

    def __init__(self, message: str, log_file: str | None = None):
        super().__init__(message)
        self.log_file = log_file


class ConfigError(ClusterbakeError):
    """Bad input: the config file or the command line. Nothing has been created."""

    exit_code = 2


class NodesDidNotBoot(ClusterbakeError):
    """Nodes a `cluster up` started did not come up: part of provisioning, whenever it is found
    (the first `cluster up` of a cluster then removes what it created)."""


class MissingImageError(ClusterbakeError):
    exit_code = 3


class CommandFailed(ClusterbakeError):
    """An external tool (ansible-playbook, packer, debootstrap) failed; see its log."""
