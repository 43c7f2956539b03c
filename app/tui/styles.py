"""The chat's stylesheet (a Python string: it ships with the code, no package data)."""

CSS = """
/* localspec chat: sidebar | messages over the prompt; status bar and key footer at the bottom. */
#sidebar {
    width: 28;
    border-right: solid $panel-lighten-2;
}
#search { margin: 0 0 1 0; }
#conversations { height: 1fr; }
#main { width: 1fr; }
#messages { height: 1fr; padding: 0 1; }
#prompt { height: auto; max-height: 10; min-height: 3; border: tall $accent; }
#notice {
    display: none;
    height: auto;
    background: $error 20%;
    color: $text;
    padding: 0 1;
}
#body { height: 1fr; }
#status {
    height: auto;
    max-height: 3;
    background: $panel;
    color: $text;
    padding: 0 1;
}
.welcome { color: $text-muted; padding: 1 0; }
.message { height: auto; margin: 0 0 1 0; }
.message.user { border-left: thick $accent; padding-left: 1; }
.message.assistant { border-left: thick $success; padding-left: 1; }
.msg-header { height: 1; }
.msg-body { margin: 0; padding: 0; }
.msg-sources { display: none; height: auto; }
ChatScreen.-sources .msg-body { display: none; }
ChatScreen.-sources .msg-sources { display: block; }

.dialog { align: center middle; }
.dialog-box {
    width: 80%;
    max-width: 90;
    height: auto;
    max-height: 90%;
    border: thick $accent;
    background: $surface;
    padding: 1 2;
}
.dialog-title { text-style: bold; margin-bottom: 1; }
.dialog-buttons { height: auto; margin-top: 1; }
.dialog-buttons Button { margin-right: 2; }
.setting { height: auto; }
.setting Label { width: 32; }
.setting Input { width: 1fr; }
.setting Switch { height: 1; border: none; padding: 0; }
.setting Checkbox { margin-right: 2; }
.system-prompt { height: 5; }
#settings-error { color: $error; }

.first-run { padding: 1 2; height: 1fr; }
#problem { margin-bottom: 1; }
.models-title { margin-top: 1; text-style: bold; }
#models { height: 1fr; }
"""
