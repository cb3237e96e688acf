from conclave.cli import run

run()
