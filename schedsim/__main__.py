from schedsim.cli import main

if __name__ == "__main__":      # not again in a spawned worker process (Dask, ...)
    main()
