from configurator.cli import entry

entry()
