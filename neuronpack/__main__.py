from neuronpack.cli.app import main

main()
