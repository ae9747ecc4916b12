"""The console's own forms: durations typed as people say them, the reveal (fields and a
reason), the data-subject search, and the sign-in refused while an address is locked out
(review.staff.security).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

from ledger.web import display
from review.privacy import payloads as privacy
from review.staff import security


class DurationWordsField(forms.DurationField):
    """A duration typed as people say it ("30 days", "12 hours", "90d", "2 weeks", "1 day 12 h",
    a plain number of days; ledger.web.display.duration_parse) and shown back the same way, every
    unit kept ("30 days"), so that saving an unchanged form changes nothing."""

    default_error_messages = {"invalid": f"Enter a duration such as {display.DURATION_HELP}."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.widget.attrs.setdefault("placeholder", "e.g. 30 days")

    def prepare_value(self, value: Any) -> Any:
        return display.duration_words(value, exact=True) if isinstance(value, timedelta) else value

    def to_python(self, value: Any) -> timedelta | None:
        if value in self.empty_values:
            return None
        if isinstance(value, timedelta):
            return value
        try:
            return display.duration_parse(str(value))
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid") from None


class RevealForm(forms.Form):
    fields_wanted = forms.MultipleChoiceField(
        label="Fields", widget=forms.CheckboxSelectMultiple, required=True, choices=()
    )
    reason = forms.CharField(
        label="Reason",
        min_length=privacy.MIN_REASON_LENGTH,
        max_length=500,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": "e.g. Ticket OPS-142: customer asks why the lead was not created"}
        ),
        help_text="Required. Logged with your name, the time and your address; auditors read it.",
    )

    def __init__(self, *args: Any, choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["fields_wanted"].choices = choices
        self.fields["fields_wanted"].initial = [c for c, _ in choices]


class SubjectSearchForm(forms.Form):
    phone = forms.CharField(required=False, max_length=40, label="Phone number")
    email = forms.CharField(required=False, max_length=254, label="Email address")
    reason = forms.CharField(
        min_length=privacy.MIN_REASON_LENGTH,
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "e.g. Access request #2291 under APP 12"}),
        help_text="Required: a search about a person is logged like a reveal.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not data.get("phone") and not data.get("email"):
            raise ValidationError("Give a phone number or an email address.")
        return data


class ThrottledAuthenticationForm(AdminAuthenticationForm):
    """The admin login, refusing attempts while this username from this address, or this
    address, is locked out (review.staff.security: nobody locks an account out from elsewhere)."""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        ip = security.client_ip(self.request)
        if security.login_locked(username=username, ip=ip):
            raise ValidationError(
                "Too many failed sign-in attempts. Wait 15 minutes or ask an administrator.", code="throttled"
            )
        try:
            data = super().clean()
        except ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                security.login_failed(username=username, ip=ip)
            raise
        security.login_succeeded(username=username, ip=ip)
        return data
