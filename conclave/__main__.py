from conclave.cli.main import run

run()
