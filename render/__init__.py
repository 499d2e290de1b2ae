"""Job spec -> Volcano Job manifest and train.sh (pure: values in, text out)."""
