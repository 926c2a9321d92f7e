from finetune_cli.cli.main import app

app()
