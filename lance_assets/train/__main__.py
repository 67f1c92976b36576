from lance_assets.train.trainer import main

if __name__ == "__main__":
    raise SystemExit(main())
