from django.urls import path

from review.privacy import subject_apis

urlpatterns = [
    path("trail", subject_apis.SubjectTrailApi.as_view(), name="subject-trail"),
    path("export", subject_apis.SubjectExportApi.as_view(), name="subject-export"),
    path("erasures", subject_apis.SubjectErasureCreateApi.as_view(), name="subject-erasure-create"),
    path("erasures/<int:erasure_id>", subject_apis.SubjectErasureDetailApi.as_view(), name="subject-erasure-detail"),
]
