! fields: a Fortran program keeping a field in a heap.
!
!   gfortran -o fields fields.f90 $(pkg-config --cflags --libs heapd-fortran heapd)
!   ./fields write     ! makes "f_u" (3 x 4 real64), f_u(i, j) = i * 10 + j
!   ./fields check     ! finds it, and C's "c_u" (C order: seen transposed)
program fields
  use heapd
  implicit none
  type(heapd_heap) :: heap
  real(real64), pointer :: u(:,:), c(:,:)
  character(len=16) :: mode
  integer :: i, j, stat

  call get_command_argument(1, mode)
  call heapd_attach(heap, "fields", create=.true., max_size=64_int64 * 1024 * 1024)
  if (mode == "write") then
    call heapd_array(heap, "f_u", u, [3, 4])
    do j = 1, 4
      do i = 1, 3
        u(i, j) = i * 10 + j
      end do
    end do
    call heapd_sync(heap)
  else if (mode == "check") then
    call heapd_array(heap, "f_u", u)            ! found, whatever its shape
    if (any(shape(u) /= [3, 4])) error stop "f_u has the wrong shape"
    do j = 1, 4
      do i = 1, 3
        if (u(i, j) /= i * 10 + j) error stop "f_u holds a wrong value"
      end do
    end do
    ! C's 4 x 3 row-major c_u is this 3 x 4 column-major array.
    call heapd_array(heap, "c_u", c, stat=stat)
    if (stat == 0) then
      if (any(shape(c) /= [3, 4])) error stop "c_u is not seen as 3 x 4"
      do j = 1, 4
        do i = 1, 3
          if (c(i, j) /= (j - 1) * 10 + (i - 1)) error stop "c_u holds a wrong value"
        end do
      end do
      print '(a)', "fields: c_u (from C) checked"
    end if
    call heapd_array(heap, "f_u", u, [4, 3], stat=stat)   ! another shape: refused
    if (stat == 0) error stop "a shape mismatch was not refused"
    print '(a)', "fields: f_u checked"
  else
    error stop "usage: fields write|check"
  end if
  call heapd_detach(heap)
end program fields
