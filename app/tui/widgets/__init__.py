"""The console's panels. Each renders from the ConsoleState (app.tui.state); none reads events."""
