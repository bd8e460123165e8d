from mstar.cli.main import main

main(prog_name="mstar")
